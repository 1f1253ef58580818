// Command gridworker is fairrun's test worker: it reads the launch
// environment, meets the other workers through the store, discovers the
// topology and prints its place in the grid, e.g.
//
//	grid 2x2 machine 1 local 0 rank 3 intra [2 3] rail [1 3] machine-id box-emu1 device cuda:0
//
// Flags make it fail or hang on purpose for fairrun's tests.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

func main() {
	failRank := flag.Int("fail-rank", -1, "this rank exits with -fail-code after discovery")
	failCode := flag.Int("fail-code", 3, "exit code of -fail-rank")
	hang := flag.Bool("hang", false, "sleep after printing until killed")
	ignoreTerm := flag.Bool("ignore-term", false, "ignore SIGTERM")
	pidDir := flag.String("pid-dir", "", "write the pid to DIR/RANK")
	timeout := flag.Duration("timeout", 30*time.Second, "rendezvous timeout")
	flag.Parse()
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	if err := run(*failRank, *failCode, *hang, *pidDir, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "gridworker:", err)
		os.Exit(1)
	}
}

func run(failRank, failCode int, hang bool, pidDir string, timeout time.Duration) error {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return err
	}
	if pidDir != "" {
		pid := []byte(strconv.Itoa(os.Getpid()))
		if err := os.WriteFile(filepath.Join(pidDir, strconv.Itoa(l.Rank)), pid, 0o644); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var opts []rendezvous.DialOption
	if l.StoreToken != "" {
		opts = append(opts, rendezvous.WithDialToken(l.StoreToken))
	}
	c, err := rendezvous.Dial(ctx, l.StoreAddr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	self, err := topology.Self{Ordinal: topology.DefaultOrdinal(l.LocalRank, os.LookupEnv)}.Describe()
	if err != nil {
		return err
	}
	layout, err := topology.Discover(ctx, rendezvous.WithPrefix(c, "gridworker"), l.Rank, l.WorldSize, self)
	if err != nil {
		return err
	}
	fmt.Printf(
		"%v intra %v rail %v machine-id %s device %s\n",
		layout,
		layout.IntraRanks(),
		layout.RailRanks(),
		self.MachineID,
		self.Device.ID,
	)
	// Everyone has printed before anyone fails on purpose.
	store := rendezvous.WithPrefix(c, "gridworker")
	if n, err := store.Add(ctx, "printed", 1); err != nil {
		return err
	} else if n == int64(l.WorldSize) {
		if err := store.Set(ctx, "all-printed", nil); err != nil {
			return err
		}
	}
	if err := store.Wait(ctx, "all-printed"); err != nil {
		return err
	}
	if l.Rank == failRank {
		fmt.Fprintf(os.Stderr, "failing on purpose with code %d\n", failCode)
		os.Exit(failCode)
	}
	if hang {
		select {}
	}
	return nil
}
