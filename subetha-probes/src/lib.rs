//! eBPF probes for subetha and the `no_std` event types they share with
//! user space. Not built out yet (see the probes issue).
#![no_std]
