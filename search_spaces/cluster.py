"""The cluster a study tunes for: a GPU kind from the hardware table, nodes × GPUs per node."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from search_spaces.hardware import GPU_TABLE, GPUSpec


#: Upper bounds checked when the job is read, before anything is enumerated or placed: placement and the
#: performance model walk every node and GPU, so a typo (``nodes: 1000000000``) would otherwise run for minutes
#: and take gigabytes. The largest deployments the product is for have thousands of GPUs; a rack-scale "node"
#: (NVL72) has 72.
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 128


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str = Field(description="A GPU kind of the hardware table.")
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(8, ge=1, le=MAX_GPUS_PER_NODE)
    rdma: bool = Field(True, description="Nodes reach each other over RDMA (scale-out bandwidth applies).")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_TABLE:
            raise ValueError(f"unknown GPU kind {v!r}; allowed: {', '.join(GPU_TABLE)}")
        return v

    @property
    def spec(self) -> GPUSpec:
        return GPU_TABLE[self.gpu]

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def same_scaleup_domain(self, gpus: int) -> bool:
        """True when a group of ``gpus`` consecutive GPUs talks over NVLink only."""
        return gpus <= max(self.spec.scaleup_domain, self.gpus_per_node)

    def describe(self) -> str:
        gpus = f"{self.total_gpus} GPU{'' if self.total_gpus == 1 else 's'}"
        return f"{self.nodes} × {self.gpus_per_node} {self.gpu} ({gpus})"
