// Package backend is the contract between fairgo's engine and the devices
// it drives: the Device and Comm interfaces a backend implements, the Rank
// that bundles them for one rank, and the Backend that setup asks to open
// them for a launched job. The CUDA backend (package cuda) and the
// simulated cluster (package sim) implement it; package hier consumes it,
// and package setup connects the two without either knowing the other.
package backend
