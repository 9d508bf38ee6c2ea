"""Drop-in replacements for the balancing code of training frameworks.

Each module exposes the public names, signatures, argument conventions, return types and
error types of one framework's balancing module, implemented on seqbalance, and a
``patch()`` / ``unpatch()`` pair that swaps the functions inside an installed framework:

- :mod:`seqbalance.compat.verl`: ``verl.utils.seqlen_balancing``.
- :mod:`seqbalance.compat.areal`: ``areal.utils.seqpack`` and AReaL's micro-batch allocation.
- :mod:`seqbalance.compat.openrlhf`: OpenRLHF's ``seqlen_balancing`` and experience balancing.
- :mod:`seqbalance.compat.slime`: slime's ``seqlen_balancing``, ``dp_schedule`` and FLOPs.
- :mod:`seqbalance.compat.joint_verl`: verl's joint mode (the driver plans ranks and
  micro-batches together per PPO mini-batch; the workers follow).
- :mod:`seqbalance.compat.joint_areal`: AReaL's joint mode (the training controller plans
  ranks and micro-batches together per PPO mini-batch; the workers follow the carried
  slots).

None of them imports its framework; torch is imported only inside functions that take
tensors. ``docs/migrating.md`` lists every behaviour difference.
"""

from __future__ import annotations

__all__ = ["areal", "joint_areal", "joint_verl", "openrlhf", "slime", "verl"]
