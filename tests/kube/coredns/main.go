// CoreDNS for the e2e's real node: cluster DNS for Services and the pods of a headless Service
// (an Indexed Job's <job>-<index>.<service>), as a cluster's own CoreDNS serves them. Only the
// plugins its Corefile uses are compiled in (tests/cluster/node.py writes the Corefile).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
