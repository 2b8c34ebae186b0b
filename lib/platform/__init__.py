"""The platform: machines, telemetry, workloads, the CUDA stack, Dask clusters."""

# Registers the Dask machine specs with lib.platform.machines.load_machine.
from lib.platform import dask_cluster  # noqa: F401
