// The exit probe is loaded with LD_PRELOAD (exit_probe.c); nothing here for Swift.
