// Command minimal is the smallest fairgo program: four simulated GPUs (2
// machines × 2) average a vector with one AllReduce each.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
)

func main() {
	ctx := context.Background()
	cluster, err := sim.NewCluster(sim.Config{Machines: 2, Devices: 2})
	check(err)
	defer cluster.Close()
	reducers, err := cluster.Reducers(ctx) // one per rank; on GPUs one per process (setup.New)
	check(err)
	defer hier.CloseAll(reducers)
	grads, works := make([]fairgo.Tensor, len(reducers)), make([]*hier.Work, len(reducers))
	for g, r := range reducers { // every rank makes its call before any rank waits
		grads[g], err = fairgo.Upload(cluster.Device(g), []float32{float32(g), 1})
		check(err)
		works[g] = r.AllReduce(ctx, grads[g], fairgo.Avg)
	}
	for g, w := range works {
		check(w.Wait(ctx))
		avg, err := fairgo.Download[float32](cluster.Device(g), grads[g])
		check(err)
		fmt.Println("rank", g, "average", avg)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
