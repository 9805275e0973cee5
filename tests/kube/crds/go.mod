// The Prometheus Operator's CRDs (example/prometheus-operator-crd in its module), to validate the
// chart's PodMonitor against a real kube-apiserver. Nothing here is built; go.sum pins the module.
module soak-sidecar.test/crds

go 1.25.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
