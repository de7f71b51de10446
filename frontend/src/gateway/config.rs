//! The gateway's settings: what a frontend's flags decide, not the routing state.

use std::time::Duration;

use super::DegradeConfig;
use crate::limits::KeyLimits;

/// Frontend behaviour that does not come from the routing state.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Require an API key (off only for local experiments).
    pub require_auth: bool,
    /// Limits for keys whose project sets none; 0 is unlimited.
    pub default_limits: KeyLimits,
    /// This replica's share of every limit.
    pub limit_share: f64,
    /// Response cache size in bytes (0 disables it).
    pub cache_bytes: usize,
    /// Refuse prompts whose text exceeds this many UTF-8 bytes (0: no limit).
    pub max_prompt_bytes: usize,
    /// Strip BOMs and invisible bidi/zero-width characters before tokenising.
    pub sanitize: bool,
    /// Share of a budget a frontend leases at a time.
    pub lease_fraction: f64,
    /// How long leases hold without another report.
    pub lease: Duration,
    /// What `degraded` does.
    pub degrade: DegradeConfig,
    /// Times one request may move to another worker when its worker fails mid-answer (0: never).
    pub migration_limit: u32,
    /// Output tokens held per request for a migration; a longer answer is not moved.
    pub migration_max_tokens: usize,
    /// How long a migration waits for a worker when none can take the request (the only worker died and its
    /// supervisor or the kubelet is restarting it): the answer goes on once one is back (0: fail at once).
    pub migration_wait: Duration,
    /// A worker that sends nothing for this long once tokens have started is treated as failed for the request.
    pub stall_timeout: Duration,
    /// How long a stored Responses API response is kept, seconds.
    pub response_ttl_s: u32,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            require_auth: true,
            default_limits: KeyLimits { requests: 4_000, input_tokens: 2_000_000, output_tokens: 400_000 },
            limit_share: 1.0,
            cache_bytes: 256 * 1024 * 1024,
            max_prompt_bytes: 4 * 1024 * 1024,
            sanitize: false,
            lease_fraction: 0.05,
            lease: Duration::from_secs(15),
            degrade: DegradeConfig::default(),
            migration_limit: 2,
            migration_max_tokens: 32_768,
            migration_wait: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            response_ttl_s: 30 * 86_400,
        }
    }
}
