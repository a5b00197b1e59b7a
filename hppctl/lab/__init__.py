"""The edge lab: an emulated heterogeneous cluster on one Linux machine (`hppctl lab`, docs/lab.md).

    layout    PURE: spec -> names, addresses, limits, per-pair rates and delays, cluster file
    presets   device presets -> CPU quota and memory limit (documented ratios)
    network   namespaces, veth pairs, the lab bridge
    shaping   tc htb egress rates; netem or the NFQUEUE delay line for delay and loss
    delayline the NFQUEUE delay line process (kernels without netem)
    cgroups   a cgroup per host, v1 or v2
    sshd      keys, known_hosts, one sshd per host inside its namespace and cgroup
    manager   up / down / status, with a state record so `down` undoes exactly what `up` made
    connect   fabric connections with host-key checking on
    probe, measure  workloads run on hosts over SSH, and the measurements built on them
"""
