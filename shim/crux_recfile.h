/*
 * crux_recfile.h - how the job-side libraries create their per-process record files in the
 * shared records directory (mode 1777, like /tmp: every job may create files there).
 *
 * Exclusively: a name another uid planted there first (a file it can truncate under our
 * mapping, a link, a FIFO) is refused, and the process runs unrecorded. A regular file of
 * our own uid under our pid is a leftover of an earlier process that had this pid (or of
 * the program this process exec'd): it is replaced. The file is ours, mode 0644 whatever
 * the umask: no other uid can shrink it, and the sticky directory keeps others from
 * removing or renaming it.
 */
#ifndef CRUX_RECFILE_H
#define CRUX_RECFILE_H

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* An fd open with `flags` (O_RDWR or O_WRONLY) on a new file at `path`, or -1 (errno set). */
static inline int crux_record_open(const char *path, int flags)
{
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
                      0644);
        if (fd >= 0) {
            (void)fchmod(fd, 0644);
            return fd;
        }
        struct stat sb;
        if (errno != EEXIST || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)
            || sb.st_uid != geteuid() || sb.st_nlink != 1 || unlink(path) != 0) {
            errno = EEXIST;
            return -1;
        }
    }
    return -1;
}

#endif /* CRUX_RECFILE_H */
