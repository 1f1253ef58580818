package main

import "github.com/fairgo/fairgo/rendezvous"

// underLauncher reports whether this process is one worker of a job of
// several processes.
func underLauncher() bool {
	l, err := rendezvous.FromEnv()
	return err == nil && l.WorldSize > 1
}
