"""The hardware a store is keyed by, and the TVM target for a budget on it."""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import asdict, dataclass, field
from functools import cache

from resaware.platform import confine

# ISA extensions that change what LLVM can emit for the kernels we tune.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "sve", "sve2", "asimddp", "i8mm", "bf16",
)  # fmt: skip


# CUDA kernels run as fast whatever CPU launches them, so GPU hardware leaves the CPU fields at this.
GPU_HOST = "any"


@dataclass(frozen=True)
class Hardware:
    """What a store's records were measured on. `id` is derived from the fields that matter."""

    cpu_model: str
    mcpu: str
    isa: tuple[str, ...]
    usable_cores: int
    tvm_version: str
    machine: str = field(default_factory=platform.machine)
    gpu_name: str | None = None
    gpu_sms: int | None = None
    gpu_arch: str | None = None

    @classmethod
    def for_gpu(cls, name: str, sms: int, arch: str, tvm_version: str, machine: str | None = None) -> Hardware:
        """The hardware CUDA records are keyed by: the GPU, not the CPU that launches its kernels."""
        return cls(cpu_model=GPU_HOST, mcpu=GPU_HOST, isa=(), usable_cores=0, tvm_version=tvm_version,
                   machine=machine or platform.machine(), gpu_name=name, gpu_sms=int(sms), gpu_arch=arch)  # fmt: skip

    @property
    def id(self) -> str:
        """Store directory name: readable prefix plus a hash of everything that changes speed."""
        keyed = [self.cpu_model, self.mcpu, ",".join(self.isa), self.machine, self.tvm_version]
        if self.gpu_name:
            keyed += [self.gpu_name, str(self.gpu_sms), str(self.gpu_arch)]
        digest = hashlib.sha256("|".join(keyed).encode()).hexdigest()[:10]
        if self.cpu_model == GPU_HOST:
            return f"{_slug(self.gpu_name)}-{self.gpu_arch}-{digest}"
        return f"{_slug(self.cpu_model)}-{self.mcpu}-{digest}"

    def to_json(self) -> dict:
        """The fields as a dict (what `hardware.json` holds)."""
        return {"id": self.id, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> Hardware:
        """The Hardware a `hardware.json` describes."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["isa"] = tuple(fields.get("isa", ()))
        return cls(**fields)

    # What must match for records to carry over, in the order a mismatch table shows them. Each changes
    # the code LLVM emits or how fast it runs: the CPU itself, what LLVM targets, the ISA extensions, the
    # architecture, the TVM version (its schedule rules and trace format), and any GPU. The usable core
    # count is not here: a budget's share key (`cpu-1of2`) already says how many cores it had.
    MATCHED = ("cpu_model", "mcpu", "isa", "machine", "tvm_version", "gpu_name", "gpu_sms", "gpu_arch")

    def differences(self, other: Hardware) -> list[str]:
        """The matched fields in which `other` differs from this hardware."""
        return [name for name in self.MATCHED if getattr(self, name) != getattr(other, name)]

    def mismatch_table(self, other: Hardware) -> str:
        """Every field, this machine's value against `other`'s, the differing ones marked."""
        rows = [("field", "this machine", "in the store", "")]
        for name in (*self.MATCHED, "usable_cores"):
            mine, theirs = getattr(self, name), getattr(other, name)
            show = lambda v: ",".join(v) if isinstance(v, tuple) else str(v)  # noqa: E731
            differs = "differs" if name in self.MATCHED and mine != theirs else ""
            rows.append((name, show(mine), show(theirs), differs))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(
            ("  " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + ("  <- " + r[3] if r[3] else "")).rstrip()
            for r in rows
        )

    def describe(self) -> str:
        """CPU model, LLVM mcpu, usable cores, GPU and TVM version in one line."""
        gpu = f", GPU {self.gpu_name} ({self.gpu_sms} SMs)" if self.gpu_name else ""
        if self.cpu_model == GPU_HOST:
            return f"{self.gpu_name} ({self.gpu_arch}, {self.gpu_sms} SMs), TVM {self.tvm_version}"
        return f"{self.cpu_model} ({self.mcpu}, {self.usable_cores} usable cores{gpu}), TVM {self.tvm_version}"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "cpu"


def cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "CPU part") and model in ("unknown", "", platform.machine()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


@cache
def host_mcpu() -> str:
    """LLVM's name for this CPU; without it LLVM emits generic code (no AVX on x86-64)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def detect() -> Hardware:
    """Describe this machine as this process sees it (its affinity decides the usable cores)."""
    import tvm

    model, flags = cpuinfo()
    return Hardware(
        cpu_model=model,
        mcpu=host_mcpu(),
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        usable_cores=len(confine.usable_cores()),
        tvm_version=str(tvm.__version__),
    )


def llvm_target(cores: int, mcpu: str | None = None):
    """The LLVM target for `cores` threads on the host CPU (or on the CPU LLVM calls `mcpu`)."""
    from tvm.target import Target

    return Target({"kind": "llvm", "mcpu": mcpu or host_mcpu(), "num-cores": int(cores)})


def target_json(target) -> str:
    """A TVM target as stable JSON text (sorted keys, values as strings)."""
    return json.dumps({k: str(v) for k, v in target.export().items()}, sort_keys=True)
