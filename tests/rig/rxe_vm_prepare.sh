#!/bin/bash
# Prepare the soft-RoCE VM used by tests/rig/rxe_vm.py: Debian 12's own 6.1 kernel
# (this host's kernel has no RDMA and cannot load modules) plus a busybox initramfs
# that mounts the host's / over virtio-9p and switch_roots into it.
#
# Idempotent: a stamp records what was built; a second run only checks it and prints
# the cache dir. CRUX_RIG_CACHE overrides the cache dir, CRUX_RIG_REFRESH=1 rebuilds.
set -euo pipefail

cache=${CRUX_RIG_CACHE:-/var/cache/crux/rxe-vm}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
init_src=$here/rxe_vm/init
recipe=1  # bump when the layout below changes

die() { echo "rxe_vm_prepare: $*" >&2; exit 1; }

[[ -f $init_src ]] || die "missing $init_src"
# The stamp covers this script and the initramfs init, so editing either rebuilds.
want="recipe=$recipe $(cat "${BASH_SOURCE[0]}" "$init_src" | sha256sum | cut -d' ' -f1)"
if [[ ${CRUX_RIG_REFRESH:-0} != 1 && -f $cache/stamp && -f $cache/initrd.img && -e $cache/vmlinuz && $(head -n1 "$cache/stamp") == "$want" ]]; then
    echo "$cache"
    exit 0
fi

[[ $(id -u) == 0 ]] || die "must run as root (depmod/mknod on the image tree)"
need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found; install the Debian package '$2'"
}
need apt-get apt
need apt-cache apt
need dpkg dpkg
need depmod kmod
need modprobe kmod
need busybox busybox-static
need xz xz-utils
need sha256sum coreutils
busybox=$(command -v busybox)
# The initramfs has no libc: only a static busybox works there.
if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked; install busybox-static"
fi

mkdir -p "$cache"
cd "$cache"

# Pick the 6.1 image that the linux-image-amd64 metapackage points at (Debian 12's
# supported kernel), unless a previous run already pinned one.
if [[ -f kver ]]; then
    kver=$(cat kver)
else
    resolve() {
        apt-cache depends linux-image-amd64 2>/dev/null \
            | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1
    }
    pkg=$(resolve)
    if [[ -z $pkg ]]; then  # a fresh machine may have no package lists yet
        apt-get update -qq >/dev/null 2>&1 || true
        pkg=$(resolve)
    fi
    [[ -n $pkg ]] || die "cannot resolve linux-image-amd64 (apt-get update failed?)"
    kver=${pkg#linux-image-}
fi
pkg=linux-image-$kver

if [[ ! -f tree/boot/vmlinuz-$kver ]]; then
    rm -rf dl tree
    mkdir dl
    (cd dl && { apt-get download "$pkg" >/dev/null 2>download.log \
        || { apt-get update -qq >/dev/null 2>&1; apt-get download "$pkg" >/dev/null 2>download.log; }; }) \
        || die "apt-get download $pkg failed: $(tail -n3 dl/download.log)"
    dpkg -x dl/"$pkg"_*.deb tree || die "dpkg -x of $pkg failed"
    rm -rf dl
fi
# The .deb ships no modules.dep (postinst runs depmod); the guest's modprobe needs it.
depmod -b "$cache/tree" "$kver" || die "depmod failed"
echo "$kver" >kver

# Initramfs: static busybox + the modules needed to reach the host's /
# (virtio-pci, 9p over virtio, overlayfs), listed in dependency order.
rm -rf initrd.d initrd.img.new
mkdir -p initrd.d/{bin,dev,proc,sys,lower,upper,newroot,mods}
cp "$busybox" initrd.d/bin/busybox
mknod initrd.d/dev/console c 5 1
mknod initrd.d/dev/null c 1 3
cp "$init_src" initrd.d/init
chmod 755 initrd.d/init
: >initrd.d/mods/order
for m in virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -d "$cache/tree" -S "$kver" --show-depends "$m" \
        || die "module $m not found in $kver"
done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r ko; do
    name=$(basename "$ko")
    case $name in
        # busybox insmod may lack compressed-module support: decompress here.
        *.ko.xz) xz -dc "$ko" >initrd.d/mods/"${name%.xz}"; name=${name%.xz} ;;
        *.ko) cp "$ko" initrd.d/mods/ ;;
        *) die "unsupported module format: $ko" ;;
    esac
    echo "$name" >>initrd.d/mods/order
done
[[ -s initrd.d/mods/order ]] || die "no modules collected"
(cd initrd.d && find . | busybox cpio -o -H newc 2>/dev/null) | gzip -1 >initrd.img.new
mv initrd.img.new initrd.img
rm -rf initrd.d
ln -sf "tree/boot/vmlinuz-$kver" vmlinuz

printf '%s\nkver=%s\n' "$want" "$kver" >stamp
echo "$cache"
