"""The launcher channel: the run dir as the sidecar sees it (``channel``), the launcher built as one
zipapp file (``zipapp``), started in local mode (``local``) or released in a pod (``pod``)."""
