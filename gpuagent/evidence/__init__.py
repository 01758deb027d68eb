"""Evidence at fault time: bundles of what a reboot destroys, gathered by root.

The agent (unprivileged) only drops an empty file named by a GPU's PCI slot into a request
directory (:mod:`gpuagent.evidence.ask`); a root unit takes nothing from it but that slot,
checked against the bus (:mod:`gpuagent.evidence.requests`), admits it under the rate limit
(:mod:`gpuagent.evidence.plan`) and gathers a bounded bundle (:mod:`gpuagent.evidence.bundle`).
The agent lists the bundles' names, for a critical problem to name its own
(:mod:`gpuagent.evidence.found`).
"""
