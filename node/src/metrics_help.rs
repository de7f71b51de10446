//! The `# HELP` text of every metric this project records, described to the recorder when it is installed, so
//! `/metrics` explains each series (Prometheus and Grafana show it). A test checks that every metric the sources
//! record has its line here.

/// (metric name, help), sorted by name.
pub const HELP: &[(&str, &str)] = &[
    ("zl_cached_prefix_blocks", "KV prefix blocks the orchestrator knows to be cached, over all workers"),
    ("zl_discovery_errors_total", "Failed calls to the discovery backend (Consul), by operation"),
    ("zl_discovery_instances", "Instances of a service the last discovery answer listed"),
    ("zl_discovery_meta_writes_total", "Writes of this process's service metadata to the discovery backend"),
    ("zl_discovery_registrations_total", "Registrations of this process with the discovery backend"),
    ("zl_discovery_up", "1 while the discovery backend answers, 0 while it does not"),
    ("zl_discovery_watch_answers_total", "Answers to this process's blocking discovery watches"),
    ("zl_discovery_workers_held", "Workers an orchestrator holds from discovery"),
    ("zl_enrollments_total", "Certificate enrollments handled, by outcome"),
    ("zl_frontend_audit_diverged", "1 while this frontend's audit chain disagrees with its committed head"),
    ("zl_frontend_audit_records_total", "Audit records written"),
    ("zl_frontend_audit_records_withheld_total", "Requests refused because their audit record could not be written"),
    ("zl_frontend_audit_write_failures_total", "Failed writes to the audit log"),
    ("zl_frontend_billing_unit", "Billing units of answered requests"),
    ("zl_frontend_budget_refusals_total", "Requests refused because their project's budget was spent"),
    ("zl_frontend_cache_bytes", "Bytes held by the deterministic response cache"),
    ("zl_frontend_cache_total", "Response cache lookups, by result (hit, miss, bypass)"),
    (
        "zl_frontend_connections_closed_unread_total",
        "Client connections closed because a request body could not be drained",
    ),
    ("zl_frontend_degraded_capped_total", "Requests whose max_tokens was capped while the cluster was degraded"),
    ("zl_frontend_edge_refused_total", "Client connections closed as they arrived, by reason (per_client: its cap)"),
    ("zl_frontend_edge_timeouts_total", "Client connections timed out at the edge, by phase"),
    ("zl_frontend_embedded_inputs_total", "Inputs embedded for clients (/v1/embeddings), by model"),
    ("zl_frontend_embedded_tokens_total", "Input tokens embedded for clients (/v1/embeddings), by model"),
    (
        "zl_frontend_ended_early_total",
        "Answers that ended without their finish (billed for what was delivered), by reason",
    ),
    ("zl_frontend_health_changes_total", "Changes of this frontend's health level, by the level entered"),
    ("zl_frontend_health_level", "Health level: 0 healthy, 1 degraded, 2 unavailable"),
    ("zl_frontend_hops_refused_total", "Spillover hop headers refused (not signed by a peer region's hop key)"),
    ("zl_frontend_itl_seconds", "Inter-token latency of streamed answers, seconds"),
    (
        "zl_frontend_keys_unverifiable",
        "1 while synced API keys were stored under another key pepper (they cannot be checked)",
    ),
    ("zl_frontend_migrated_tokens_total", "Output tokens a migrated request resumed after (prefilled again, unbilled)"),
    ("zl_frontend_migration_seconds", "Time from a worker's failure to the next worker's first frame, seconds"),
    ("zl_frontend_migration_waits_total", "Migrations that waited for a worker to take the request"),
    ("zl_frontend_migrations_total", "Requests moved to another worker mid-answer, by cause"),
    ("zl_frontend_no_capacity_total", "Requests answered 529 because no model can be served yet, by reason"),
    (
        "zl_frontend_orchestrator_failovers_total",
        "Calls moved to another orchestrator after one failed (no connection, a lost one, or past its deadline)",
    ),
    (
        "zl_frontend_orchestrator_not_ready_total",
        "Calls moved to another orchestrator because one answered it was not ready yet (joining, or just started)",
    ),
    (
        "zl_frontend_orchestrator_rounds_retried_total",
        "Orchestrator calls asked of every orchestrator again because one answered it was not ready yet",
    ),
    ("zl_frontend_output_tokens_total", "Output tokens sent to clients, by model"),
    (
        "zl_frontend_peers_refused_total",
        "Peer regions left out of spillover (a URL or setting refused), once per region and reason",
    ),
    ("zl_frontend_rate_limited_total", "Requests refused by a rate limit, by dimension"),
    ("zl_frontend_report_failures_total", "Failed usage reports to the orchestrators"),
    ("zl_frontend_report_seconds", "Time to send a usage report to the orchestrators, seconds"),
    ("zl_frontend_request_duration_seconds", "Request duration from arrival to the last byte, seconds"),
    ("zl_frontend_requests_total", "Requests answered, by API, model and status"),
    ("zl_frontend_retries_total", "Requests sent to another worker after a worker failed before answering"),
    ("zl_frontend_route_seconds", "Time to get a route from an orchestrator, seconds"),
    ("zl_frontend_sanitized_chars_total", "Characters removed from prompts by input sanitization"),
    ("zl_frontend_shed_total", "Requests shed under degradation, by priority level"),
    ("zl_frontend_spill_connections_total", "Connections opened to peer regions for spillover"),
    ("zl_frontend_spill_head_seconds", "Time until a peer region's answer began, seconds"),
    ("zl_frontend_spills_total", "Requests spilled to a peer region, by region and outcome"),
    ("zl_frontend_state_index", "Raft index of the routing state this frontend last synced"),
    (
        "zl_frontend_stored_response_calls_total",
        "Reads, deletes and input-item listings of stored responses, by operation and status",
    ),
    ("zl_frontend_stored_response_seconds", "Time to read, delete or list a stored response, by operation"),
    ("zl_frontend_stored_responses_total", "Responses API responses stored with the orchestrators"),
    ("zl_frontend_sync_failures_total", "Failed syncs of the routing state from the orchestrators"),
    ("zl_frontend_tool_calls_total", "Tool calls returned to clients, by API"),
    ("zl_frontend_ttft_seconds", "Time to first token, seconds, by model"),
    ("zl_frontend_usage_capped_total", "Worker usage figures capped at the request's prompt and max_tokens"),
    ("zl_frontend_worker_failures_total", "Requests whose worker failed while serving them"),
    (
        "zl_frontend_worker_mismatches_total",
        "Worker connections answered by another worker than the one routed to (refused)",
    ),
    ("zl_ledger_audit_heads", "Frontends' audit chain heads held in the routing state"),
    ("zl_ledger_audit_heads_refused_total", "Audit head updates refused (not extending the committed chain)"),
    ("zl_ledger_rate_buckets", "Rate-limit buckets the usage ledger holds"),
    ("zl_ledger_reports_total", "Frontend usage reports applied to the ledger"),
    ("zl_ledger_usage_hours", "Usage rows (project, key, hour) the ledger holds"),
    ("zl_raft_applied_index", "Raft log index applied to the routing state"),
    ("zl_raft_commit_index", "Raft log index known committed"),
    ("zl_raft_dropped_messages_total", "Raft messages to a peer dropped (its queue was full), by peer"),
    ("zl_raft_fatal_errors_total", "Raft errors that stopped the replica"),
    ("zl_raft_impostors_total", "Raft messages, proposals or joins refused: the certificate is not the member's"),
    ("zl_raft_is_leader", "1 while this orchestrator leads the Raft group"),
    ("zl_raft_leader_id", "Raft id of the leader this orchestrator knows (0: none)"),
    ("zl_raft_learners", "Learners (non-voting members) of the Raft group"),
    ("zl_raft_log_bytes", "Bytes of the Raft log on disk"),
    ("zl_raft_proposal_seconds", "Time from proposing a routing-state change to its commit, seconds"),
    ("zl_raft_send_failures_total", "Failed sends of Raft messages, by peer"),
    ("zl_raft_snapshot_age_seconds", "Age of the newest Raft snapshot, seconds"),
    ("zl_raft_snapshot_index", "Raft log index of the newest snapshot"),
    ("zl_raft_term", "Current Raft term"),
    ("zl_raft_term_changes_total", "Raft term changes seen (elections)"),
    ("zl_raft_up", "1 while this orchestrator's Raft task runs; 0 once it stopped (its storage failed)"),
    ("zl_raft_voters", "Voting members of the Raft group"),
    ("zl_route_decision_seconds", "Time to make a routing decision, seconds"),
    ("zl_route_decisions_total", "Routing decisions, by policy and outcome"),
    ("zl_rpc_calls_total", "Cluster RPC calls, by side, kind and outcome"),
    ("zl_rpc_connections_total", "Cluster RPC (QUIC) connections, by side and result"),
    ("zl_rpc_frames_refused_total", "RPC frames refused (oversized or malformed)"),
    ("zl_soft_state_age_seconds", "Age of the oldest worker load report the orchestrator holds, seconds"),
    ("zl_state_applied_index", "Routing-state index applied by this orchestrator"),
    ("zl_state_commands_total", "Routing-state commands applied, by kind and outcome"),
    (
        "zl_stored_response_bytes",
        "Bytes of stored Responses API responses in the replicated state, as a snapshot holds them",
    ),
    ("zl_stored_responses", "Stored Responses API responses in the replicated state"),
    ("zl_tls_certificate_not_after_seconds", "Expiry of this process's certificate, Unix seconds"),
    ("zl_tls_certificate_reload_failures_total", "Failed reloads of this process's certificate files"),
    ("zl_tls_certificate_reloads_total", "Reloads of this process's certificate files (rotations taken)"),
    ("zl_tls_renewals_total", "Renewals of an enrolled certificate, by result"),
    ("zl_worker_adapter_bytes", "Bytes the loaded LoRA adapters' updates take"),
    ("zl_worker_adapter_evictions_total", "LoRA adapters evicted (least recently used idle) to make room"),
    ("zl_worker_adapter_load_seconds", "Time to check and load a LoRA adapter, seconds"),
    ("zl_worker_adapter_loads_total", "LoRA adapter loads, by result (loaded, refused)"),
    ("zl_worker_adapter_requests_total", "Requests naming a LoRA adapter, by whether it was resident or loaded"),
    ("zl_worker_adapters_max", "LoRA adapters a worker keeps loaded at most (--max-adapters)"),
    ("zl_worker_adapters_resident", "LoRA adapters loaded now"),
    ("zl_worker_cancelled_total", "Sequences cancelled (their client went away)"),
    ("zl_worker_cpu_kernels", "1 for the CPU kernel level (ISA) the worker runs"),
    ("zl_worker_draft_tokens_accepted_total", "Predictive-streaming draft tokens accepted"),
    ("zl_worker_draft_tokens_total", "Predictive-streaming draft tokens proposed"),
    ("zl_worker_embed_pass_seconds", "Time of one embedding pass over a batch of inputs"),
    ("zl_worker_embedded_inputs_total", "Inputs an embedding model embedded"),
    ("zl_worker_embedded_tokens_total", "Tokens an embedding model embedded"),
    ("zl_worker_grammar_closings_total", "Constrained answers closed before their token limit"),
    ("zl_worker_grammar_mask_seconds", "Time to compute a constrained-decoding token mask, seconds"),
    ("zl_worker_handed_over_total", "Running requests handed to other workers at the end of a drain"),
    ("zl_worker_heartbeat_failures_total", "Failed heartbeats or load reports to the orchestrators"),
    ("zl_worker_kv_blocks_cached", "KV-cache blocks holding reusable prefixes"),
    ("zl_worker_kv_blocks_free", "Free KV-cache blocks"),
    ("zl_worker_kv_blocks_total", "KV-cache blocks in all"),
    ("zl_worker_kv_blocks_used", "KV-cache blocks used by running sequences"),
    (
        "zl_worker_kv_bytes_per_token",
        "Bytes one token's keys and values take across the layers, by model and KV dtype (f16, q8)",
    ),
    ("zl_worker_kv_fragmentation_ratio", "Share of allocated KV-cache slots left unused in partly filled blocks"),
    ("zl_worker_kv_tier_bytes", "Bytes a lower KV tier holds now, by tier (host, disk)"),
    ("zl_worker_kv_tier_bytes_in_total", "Bytes of KV blocks written into a lower tier, by tier"),
    ("zl_worker_kv_tier_bytes_out_total", "Bytes of KV blocks read back from a lower tier, by tier"),
    ("zl_worker_kv_tier_corrupt_total", "Disk tier block files refused (checksum, key or shape wrong) and recomputed"),
    ("zl_worker_kv_tier_dropped_total", "KV blocks not written to a lower tier (writer queue full, or a write failed)"),
    ("zl_worker_kv_tier_hits_total", "KV blocks brought back from a lower tier instead of computed, by tier"),
    ("zl_worker_kv_tier_load_seconds", "Time to bring KV blocks back from a lower tier, by tier, seconds"),
    ("zl_worker_output_tokens_total", "Output tokens generated"),
    ("zl_worker_prefill_tokens_total", "Prompt tokens prefilled (cached prefixes excluded)"),
    ("zl_worker_prefix_hit_rate", "Share of prompt tokens found in the prefix cache"),
    ("zl_worker_queue_depth", "Sequences waiting for admission"),
    ("zl_worker_registrations_total", "Registrations of this worker with the orchestrators"),
    ("zl_worker_resumed_tokens_total", "Output tokens of migrated requests this worker resumed after"),
    ("zl_worker_running_sequences", "Sequences running"),
    ("zl_worker_step_seconds", "Duration of one batched model step, seconds"),
    ("zl_worker_thinking_closed_total", "Thinking sections closed by their token budget"),
    ("zl_worker_time_per_output_token_seconds", "Time per output token, seconds"),
    ("zl_worker_tokens_per_second", "Output tokens per second over the last report interval"),
    ("zl_workers", "Workers known to the orchestrator, by state"),
];

/// Describe every metric of [`HELP`] to the installed recorder. The Prometheus exporter keeps one description per
/// name whatever the kind (its three `describe_*` calls are the same), so one call serves counters, gauges and
/// histograms.
pub fn describe_all() {
    for &(name, help) in HELP {
        metrics::describe_counter!(name, help);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The name of every counter, gauge and histogram macro call with a literal name in the workspace's sources.
    fn recorded(dir: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() && !matches!(name.as_str(), "target" | ".git" | ".tools" | ".venv" | "node_modules") {
                recorded(&path, out);
            } else if name.ends_with(".rs") && path.to_string_lossy().contains("/src/") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for kind in ["counter!(\"", "gauge!(\"", "histogram!(\""] {
                    for rest in text.split(kind).skip(1) {
                        out.insert(rest.split('"').next().unwrap().to_owned());
                    }
                }
            }
        }
    }

    #[test]
    fn every_recorded_metric_has_help_and_no_help_is_left_over() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut names = std::collections::BTreeSet::new();
        recorded(root, &mut names);
        assert!(names.len() > 50, "{names:?}");
        let helped: Vec<&str> = HELP.iter().map(|h| h.0).collect();
        let missing: Vec<&String> = names.iter().filter(|n| !helped.contains(&n.as_str())).collect();
        assert!(missing.is_empty(), "metrics without a HELP line in node/src/metrics_help.rs: {missing:?}");
        let stale: Vec<&&str> = helped.iter().filter(|h| !names.contains(**h)).collect();
        assert!(stale.is_empty(), "HELP for metrics nothing records: {stale:?}");
        assert!(helped.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
    }
}
