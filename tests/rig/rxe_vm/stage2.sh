#!/bin/bash
# Second stage of the soft-RoCE VM, PID 1 after switch_root (see rxe_vm/init).
# Sets up two rxe devices over a veth pair, runs the caller's script from the work
# dir (/.crux-vm, a 9p mount of a host temp dir) and powers off. Results go back as
# /.crux-vm/output (script stdout+stderr) and /.crux-vm/rc (its exit status).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TMPDIR=/run/tmp
work=/.crux-vm
log=$work/setup.log

say() { echo "crux-stage2: $*" | tee -a "$log"; }

poweroff_now() {
    sync
    umount "$work" 2>/dev/null
    busybox poweroff -f 2>/dev/null
    echo o >/proc/sysrq-trigger
    sleep 30
}

# Run one setup step; on failure report which one through output/rc and stop.
step() {
    local name=$1
    shift
    echo "+ $*" >>"$log"
    if ! "$@" >>"$log" 2>&1; then
        say "setup step '$name' failed: $*"
        {
            echo "crux rxe-vm: setup step '$name' failed: $*"
            echo "--- setup log (tail) ---"
            tail -n 30 "$log"
        } >"$work/output"
        echo 125 >"$work/rc"
        poweroff_now
    fi
}

mounts() {
    mount -t proc proc /proc &&
        mount -t sysfs sysfs /sys &&
        mount -t devtmpfs devtmpfs /dev &&
        mkdir -p /dev/pts /dev/shm &&
        mount -t devpts devpts /dev/pts &&
        mount -t tmpfs tmpfs /dev/shm &&
        mount -t tmpfs -o mode=755 tmpfs /run &&
        mkdir -p -m 1777 /run/tmp
    # No tmpfs over /tmp: the repo may live there (a CI checkout) and must stay visible. The
    # overlay already makes /tmp writable; TMPDIR keeps the guest's scratch files off it.
}

# Wait until the rxe device has its IPv4 RoCEv2 GID (index 1) populated.
wait_gid() {
    local f=/sys/class/infiniband/$1/ports/1/gids/1 i
    for i in $(seq 100); do
        [[ -r $f && $(cat "$f") != 0000:0000:0000:0000:0000:0000:0000:0000 ]] && {
            echo "$1 gid1 $(cat "$f")"
            return 0
        }
        sleep 0.1
    done
    return 1
}

: >"$log"
step mounts mounts
step lo ip link set lo up
step modprobe modprobe rdma_rxe
# Both ends in the initial namespace: rxe on 6.1 does not work across namespaces.
step veth ip link add veth0 type veth peer name veth1
step addr0 ip addr add 10.77.0.1/24 dev veth0
step addr1 ip addr add 10.77.0.2/24 dev veth1
step up0 ip link set veth0 up
step up1 ip link set veth1 up
# Policy routing so traffic between the two local addresses really crosses the veth
# (instead of short-circuiting through lo), which rxe needs to see its packets.
step rule0 ip rule add pref 10 iif lo to 10.77.0.2 lookup 100
step route0 ip route add 10.77.0.2 dev veth0 src 10.77.0.1 table 100
step rule1 ip rule add pref 11 iif lo to 10.77.0.1 lookup 101
step route1 ip route add 10.77.0.1 dev veth1 src 10.77.0.2 table 101
step rule-local ip rule add pref 100 lookup local
step rule-del0 ip rule del pref 0
for k in net.ipv4.conf.{all,default,veth0,veth1}.rp_filter=0 \
    net.ipv4.conf.{all,veth0,veth1}.accept_local=1; do
    step sysctl sysctl -qw "$k"
done
step rxe0 rdma link add rxe0 type rxe netdev veth0
step rxe1 rdma link add rxe1 type rxe netdev veth1
step gid-rxe0 wait_gid rxe0
step gid-rxe1 wait_gid rxe1
say "rxe ready"

repo=$(cat "$work/repo")
cd "$repo" || { echo "crux rxe-vm: cannot cd to $repo" >"$work/output"; echo 125 >"$work/rc"; poweroff_now; }
CRUX_RXE_VM=1 bash "$work/script.sh" </dev/null >"$work/output" 2>&1
echo $? >"$work/rc"
say "script exited $(cat "$work/rc")"
poweroff_now
