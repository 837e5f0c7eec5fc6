"""The ``--mesh`` mini-language: ``i=4,j=2`` or ``data=-1,model=2``.

Pure and jax-free: the CLI uses :func:`parse` to reject bad syntax before
anything starts, and the child-side shim uses :func:`resolve` once it knows
how many devices the job has.
"""

from __future__ import annotations

import dataclasses
import math

AXIS_TYPES = ("auto", "explicit")


class MeshSpecError(ValueError):
    """A mesh spec that cannot be parsed or does not fit the devices."""


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Axis names and sizes in order; one size may be -1 (inferred)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes))


def parse(text: str) -> MeshSpec:
    """Parse ``NAME=SIZE[,NAME=SIZE...]``; SIZE is a positive integer or -1."""
    if not text or not text.strip():
        raise MeshSpecError("empty mesh spec; expected NAME=SIZE[,NAME=SIZE...], e.g. i=4,j=2")
    names: list[str] = []
    sizes: list[int] = []
    for part in text.split(","):
        name, sep, size_text = (s.strip() for s in part.partition("="))
        if not sep or not name or not size_text:
            raise MeshSpecError(f"{part.strip()!r} in mesh spec {text!r} is not NAME=SIZE")
        if not name.isidentifier():
            raise MeshSpecError(f"mesh axis name {name!r} is not an identifier")
        if name in names:
            raise MeshSpecError(f"mesh axis {name!r} appears twice in {text!r}")
        try:
            size = int(size_text)
        except ValueError:
            raise MeshSpecError(f"mesh axis {name}={size_text!r}: size is not an integer") from None
        if size == 0 or size < -1:
            raise MeshSpecError(f"mesh axis {name}={size}: size must be positive, or -1 to infer it")
        names.append(name)
        sizes.append(size)
    if sizes.count(-1) > 1:
        raise MeshSpecError(f"mesh spec {text!r} has more than one -1; at most one size can be inferred")
    return MeshSpec(tuple(names), tuple(sizes))


def resolve(spec: MeshSpec, device_count: int) -> tuple[int, ...]:
    """Concrete axis sizes whose product is ``device_count``, or a clear error."""
    known = math.prod(s for s in spec.sizes if s != -1)
    if -1 in spec.sizes:
        if device_count % known:
            raise MeshSpecError(
                f"mesh {spec}: cannot infer the -1 axis, the job has {device_count} devices, "
                f"which is not a multiple of the other axes' product {known}"
            )
        return tuple(device_count // known if s == -1 else s for s in spec.sizes)
    if known != device_count:
        raise MeshSpecError(
            f"mesh {spec} needs {known} devices, but the job has {device_count} devices"
        )
    return spec.sizes


def split_across_processes(sizes: tuple[int, ...], num_granules: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Split axis sizes into (per-granule, across-granule) shapes, leading axes first.

    The across-granule (DCN) factor is taken from the leading axes, so the
    first axis spans hosts, as users of hybrid meshes expect.  Raises when the
    granule count does not divide into the axes in order.
    """
    remaining = num_granules
    inner, outer = [], []
    for size in sizes:
        take = math.gcd(size, remaining)
        outer.append(take)
        inner.append(size // take)
        remaining //= take
    if remaining != 1:
        raise MeshSpecError(
            f"mesh {sizes} cannot be laid out over {num_granules} processes: "
            f"the leading axes must take a factor of {num_granules}"
        )
    return tuple(inner), tuple(outer)
