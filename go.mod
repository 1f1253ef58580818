module github.com/fairgo/fairgo

go 1.26.8

require (
	github.com/NVIDIA/go-nvml v0.13.0-1
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.24.0
	gorgonia.org/cu v0.9.6
	pgregory.net/rapid v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
