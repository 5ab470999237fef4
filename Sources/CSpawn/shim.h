#ifndef KEYCHAIN_CSPAWN_SHIM_H
#define KEYCHAIN_CSPAWN_SHIM_H
#include <spawn.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>

// glibc declares these only for _GNU_SOURCE / _DEFAULT_SOURCE, which Swift's Glibc module is built without.
// posix_spawn_file_actions_addclosefrom_np: glibc 2.34 (Debian 12 has 2.36).
extern int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *actions, int from);
extern int pipe2(int pipefd[2], int flags);
extern int pthread_setname_np(pthread_t thread, const char *name);
// pidfd_open: glibc 2.36 (<sys/pidfd.h>); the variadic syscall() is not callable from Swift.
extern int pidfd_open(pid_t pid, unsigned int flags);
#endif
