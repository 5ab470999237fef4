/* Lets valgrind 3.19 run a Swift program with an async main (scripts/warm-read-instructions.sh).
 *
 * Such a main ends in dispatch_main(), whose thread waits in sigsuspend() with a mask in libdispatch's
 * read-only data (_dispatch_sigsuspend.mask). valgrind 3.19's rt_sigsuspend wrapper edits the mask it
 * is given in place (it takes its own signal out of it), so valgrind dies of SIGSEGV in its own code
 * (si_code 2, the fault at that mask's address) at the first sigsuspend. Preloaded, this sigsuspend
 * hands the kernel a writable copy of the mask instead; nothing else changes.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

int sigsuspend(const sigset_t *mask) {
    sigset_t copy = *mask;
    return (int)syscall(SYS_rt_sigsuspend, &copy, (size_t)(_NSIG / 8));
}
