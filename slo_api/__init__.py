"""slo-api: a REST front door onto the Kubernetes custom resources that hold inference SLOs."""

__version__ = "0.1.0"
