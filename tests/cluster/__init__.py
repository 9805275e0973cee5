"""Kubernetes clusters for the end-to-end tests: a real single node built here, or kind.

``node`` runs containerd, runc and the CNI plugins from Debian with etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kubelet built from their Go modules; ``kind`` drives
Docker and kind for users who have them. ``python3 -m tests.cluster --help`` brings either up by hand.
"""
