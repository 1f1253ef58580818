// Package launchjob is the launcher form of the GPU test binaries: this
// process's rank of a job that a launcher (fairrun, torchrun) started,
// joined through the launcher's store and setup.Connect. The tests of
// several packages share it; it imports no backend, so that a backend's own
// tests can use it.
package launchjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/rendezvous"
)

// Job is this process's rank of the launcher's job.
type Job struct {
	Launch rendezvous.Launch
	Store  *rendezvous.LaunchStore
	// Rank is the device and communicators the tests share; the Job owns
	// them.
	Rank backend.Rank
}

// Launched reports whether this process runs as one rank of a launcher's
// job.
func Launched() bool {
	_, err := rendezvous.FromEnv()
	return !errors.Is(err, rendezvous.ErrNoLaunchEnv)
}

// Open joins the launcher's job: the launcher's store, then setup.Connect
// with b under the store prefix prefix (the same on every rank).
func Open(ctx context.Context, b backend.Backend, prefix string) (*Job, error) {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return nil, fmt.Errorf("the launch environment: %w", err)
	}
	j := &Job{Launch: l}
	if j.Store, err = rendezvous.Open(ctx, l); err != nil {
		return nil, fmt.Errorf("the launcher's store: %w", err)
	}
	rks, err := setup.Connect(ctx, j.Store, b, nil, setup.WithStorePrefix(prefix))
	if err != nil {
		return j, err // Close leaves the store
	}
	j.Rank = rks[0]
	return j, nil
}

// Close releases the rank and leaves the store: a rank that hosts it serves
// until the others have left (a minute at most). A nil Job closes as
// nothing.
func (j *Job) Close() error {
	if j == nil {
		return nil
	}
	var errs []error
	if j.Rank.Device != nil {
		errs = append(errs, j.Rank.Release())
	}
	if j.Store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		errs = append(errs, j.Store.Leave(ctx))
	}
	return errors.Join(errs...)
}
