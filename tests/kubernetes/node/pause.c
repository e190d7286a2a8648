/* The pod sandbox's one process: hold the pod's namespaces, reap orphans, exit on SIGINT/SIGTERM.
 * Built statically (gcc -static) into the pause image of the test node; the same job as Kubernetes'
 * build/pause/linux/pause.c. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(sig == SIGINT || sig == SIGTERM ? 0 : 2); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction on_quit = {.sa_handler = quit};
	struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (getpid() != 1) {
		return 1; /* only meaningful as a container's init */
	}
	sigaction(SIGINT, &on_quit, NULL);
	sigaction(SIGTERM, &on_quit, NULL);
	sigaction(SIGCHLD, &on_child, NULL);
	for (;;) {
		pause();
	}
}
