//! Helpers for zerolayer's black-box tests: find the real binaries (built beforehand by `scripts/test`) and run
//! them as processes. The tests build nothing themselves and talk to the processes only over 127.0.0.1.
//!
//! One file per concern: [`process`] (binaries, processes, signals), [`ports`] (free loopback ports), [`http`]
//! (requests to the frontend), [`metrics`] (Prometheus figures), [`tiers`] (certificates, each tier and a small
//! cluster), [`up`] (`zl up`'s state file), [`consul`] (a Consul agent), [`docs`] (code blocks of the documents).
//! Everything is re-exported here.

pub mod consul;
pub mod docs;
pub mod http;
pub mod metrics;
pub mod ports;
pub mod process;
pub mod tiers;
pub mod up;

pub use docs::code_blocks;
pub use http::{HttpResponse, HttpStream, ask_messages, http, http_stream, request, serving};
pub use metrics::{frontend_metrics, gauge, metric_sum, metrics};
pub use ports::{free_tcp, free_tcp_udp, free_udp};
pub use process::{Proc, alive, bin, python, sdk_script, signal, zl};
pub use tiers::{
    OrchestratorProc, SmallCluster, Tiers, WorkerProc, admin, admin_as, certs, certs_more, client, small_cluster,
    start_frontend, start_frontend_args, start_orchestrator, start_orchestrator_at, start_tiers, start_worker,
    start_worker_args, wait_for_key, wait_up, zl_up,
};
pub use up::{pids, read_state, up_admin, up_projects, wait_restarted};
