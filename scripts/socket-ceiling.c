/* The machine's ceiling for keychaind's 16 x 1,000 figure: what two processes exchanging requests and
 * replies on Unix stream sockets can do with no keychain code at all (docs/performance.md, "Issue 18's
 * targets before and after, alternated on one machine").
 *
 * CLIENTS threads each hold a socketpair to a forked server process that runs a thread per connection,
 * as keychaind does; each round trip sends a 200-byte request and reads a 200-byte reply (about a warm
 * read's frames). It prints the round trips per second of all clients together.
 *
 *   cc -O2 -pthread -o /tmp/socket-ceiling scripts/socket-ceiling.c
 *   /tmp/socket-ceiling 16 1000      # CLIENTS ROUNDS (each)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { frameSize = 200, mostClients = 1024 };
static int rounds;

/* The whole frame sent or received; nonzero when the peer closed or the call failed. */
static int whole(int fd, char *frame, int reading) {
    int done = 0;
    while (done < frameSize) {
        ssize_t moved = reading ? recv(fd, frame + done, frameSize - done, 0) : send(fd, frame + done, frameSize - done, 0);
        if (moved <= 0) return -1;
        done += (int)moved;
    }
    return 0;
}

static void *serve(void *argument) {
    int fd = (int)(long)argument;
    char frame[frameSize];
    while (whole(fd, frame, 1) == 0 && whole(fd, frame, 0) == 0) {}
    return NULL;
}

static void *call(void *argument) {
    int fd = (int)(long)argument;
    char frame[frameSize] = {1};
    for (int round = 0; round < rounds; round++) {
        if (whole(fd, frame, 0) || whole(fd, frame, 1)) { perror("socket-ceiling: a round trip"); exit(1); }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int clients = argc == 3 ? atoi(argv[1]) : 0;
    rounds = argc == 3 ? atoi(argv[2]) : 0;
    if (clients < 1 || clients > mostClients || rounds < 1) {
        fprintf(stderr, "usage: socket-ceiling CLIENTS ROUNDS (1 to %d clients, at least one round each)\n", mostClients);
        return 2;
    }
    static int client[mostClients], server[mostClients];
    for (int i = 0; i < clients; i++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair)) { perror("socket-ceiling: socketpair"); return 1; }
        client[i] = pair[0];
        server[i] = pair[1];
    }
    pid_t pid = fork();
    if (pid < 0) { perror("socket-ceiling: fork"); return 1; }
    static pthread_t thread[mostClients];
    if (pid == 0) {
        for (int i = 0; i < clients; i++) {
            close(client[i]);
            pthread_create(&thread[i], NULL, serve, (void *)(long)server[i]);
        }
        for (int i = 0; i < clients; i++) pthread_join(thread[i], NULL);
        _exit(0);
    }
    for (int i = 0; i < clients; i++) close(server[i]);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < clients; i++) pthread_create(&thread[i], NULL, call, (void *)(long)client[i]);
    for (int i = 0; i < clients; i++) pthread_join(thread[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9;
    printf("%d clients x %d round trips: %.0f round trips/s\n", clients, rounds, clients * (double)rounds / seconds);
    for (int i = 0; i < clients; i++) close(client[i]);
    waitpid(pid, NULL, 0);
    return 0;
}
