/*
 * crux_recfile.h - how the job-side libraries create their per-process record files in the
 * shared records directory (mode 1777, like /tmp: every job may create files there).
 *
 * Who wrote it. A file is named after getpid(), the pid in the job's own pid namespace, which
 * the agent (in the host's, or its own) cannot look up. So the writer holds a classic POSIX
 * record lock on it (F_SETLK, F_WRLCK, byte 0, length 1) for its whole life, on the descriptor
 * crux_record_open returns, which it keeps open. The agent asks F_GETLK on its own read-only
 * descriptor and the kernel answers with the holder's pid translated into the AGENT's pid
 * namespace (fs/locks.c, Linux >= 4.15); the lock dies with the process, so a held lock is a
 * live writer, never a reused pid (transport/pid_files.py). Not an OFD lock: F_GETLK reports
 * pid -1 for those. Such a lock belongs to the process: closing any descriptor of the file in
 * the process drops it (the socket interposer keeps the program from closing its descriptor:
 * crux_sockbytes.c), a forked child does not hold it (it makes its own file), and exec drops
 * it (O_CLOEXEC): the exec'd program's library replaces the file, as a leftover.
 *
 * Created exclusively, mode 0600 until locked: no other uid can open it meanwhile and take a
 * read lock that would refuse ours, and a writer of our uid does not take it for a leftover.
 * Then CRUX_RECORD_MODE, 0444, which tells the agent that this writer locks: such a file
 * without a lock is gone. An older writer's file (no lock) is 0644, and the agent checks its
 * name's pid as before; so is ours when the filesystem refuses the lock. The file is ours: no
 * other uid can shrink it, and the sticky directory keeps others from removing or renaming it.
 *
 * Names: `<path>`, else `<path>.1` ... `<path>.63`: processes of two containers may share a
 * pid. A name is taken when it is free, or when it holds a leftover: a finished regular file
 * of our uid, one link, that no process holds locked (an earlier process that had this pid,
 * here or in another pid namespace, or the program this process exec'd); that is replaced. A
 * live writer's file, another uid's, a link, a FIFO, a file being created: the next name.
 */
#ifndef CRUX_RECFILE_H
#define CRUX_RECFILE_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CRUX_RECORD_MODE 0444     /* a writer that holds its lock */
#define CRUX_RECORD_OLD_MODE 0644 /* a writer that does not (older, or locks refused) */
#define CRUX_RECORD_NAMES 64

/* fcntl `cmd` (F_SETLK or F_GETLK) on the record's byte: 0, or -1 (errno set). */
static inline int crux_record_lock(int fd, int cmd, struct flock *l)
{
    l->l_whence = SEEK_SET;
    l->l_start = 0;
    l->l_len = 1;
    l->l_pid = 0;
    return fcntl(fd, cmd, l);
}

/* Whether `path` holds a leftover (see above) that we may replace. */
static inline int crux_record_leftover(const char *path)
{
    struct stat sb, fsb;
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid()
        || sb.st_nlink != 1 || ((sb.st_mode & 07777) != CRUX_RECORD_MODE
                                && (sb.st_mode & 07777) != CRUX_RECORD_OLD_MODE))
        return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct flock l = {.l_type = F_RDLCK}; /* a writer's lock; readers' read locks do not count */
    int unlocked = fstat(fd, &fsb) == 0 && fsb.st_ino == sb.st_ino && fsb.st_dev == sb.st_dev
                   && crux_record_lock(fd, F_GETLK, &l) == 0 && l.l_type == F_UNLCK;
    close(fd); /* we hold no lock on it to lose: ours are under other names */
    return unlocked;
}

/* An fd open with `flags` (O_RDWR or O_WRONLY) on a new file at `path` (a buffer of `cap`
 * bytes, to which a `.N` may be added: the name taken), locked; or -1 (errno set, EEXIST when
 * every name is taken). The caller keeps the fd open while the process lives. */
static inline int crux_record_open(char *path, size_t cap, int flags)
{
    size_t n = strlen(path);
    for (int i = 0; i < CRUX_RECORD_NAMES; i++) {
        if (i > 0 && (size_t)snprintf(path + n, cap - n, ".%d", i) >= cap - n)
            break;
        for (int tries = 0; tries < 2; tries++) {
            int fd = open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
                          0600);
            if (fd >= 0) {
                struct flock l = {.l_type = F_WRLCK};
                int locked = crux_record_lock(fd, F_SETLK, &l) == 0;
                (void)fchmod(fd, locked ? CRUX_RECORD_MODE : CRUX_RECORD_OLD_MODE);
                return fd;
            }
            if (errno != EEXIST)
                return -1; /* no directory, no room: no other name does better */
            if (!crux_record_leftover(path) || unlink(path) != 0)
                break;
        }
    }
    path[n] = '\0';
    errno = EEXIST;
    return -1;
}

#endif /* CRUX_RECFILE_H */
