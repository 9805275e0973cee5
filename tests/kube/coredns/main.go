// CoreDNS for the e2e's real node: cluster DNS for Services and the pods of a headless Service
// (an Indexed Job's <job>-<index>.<service>), as a cluster's own CoreDNS serves them. Only the
// plugins its Corefiles use are compiled in: the real node's (tests/cluster/node.py writes it) and
// the one kubeadm writes on the kind node (tests/cluster/kind_image.py).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
