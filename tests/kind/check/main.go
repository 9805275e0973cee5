// kind-config-check reads a kind config file through kind's own loader (strict decoding of
// kind.x-k8s.io/v1alpha4, its defaults) and validation, the steps `kind create cluster --config`
// takes before it creates anything, and prints each node's role and image. build.sh compiles it
// inside a copy of the kind module: only packages under sigs.k8s.io/kind/pkg may import the
// loader (Go's internal rule).
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kind/pkg/internal/apis/config/encoding"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kind-config-check CONFIG")
		os.Exit(2)
	}
	cfg, err := encoding.Load(os.Args[1])
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, node := range cfg.Nodes {
		fmt.Printf("%s %s\n", node.Role, node.Image)
	}
}
