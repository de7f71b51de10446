//! Where a model runs: the CPU (the default, always built), or an NVIDIA GPU (`--device cuda:N`, in builds with
//! the `cuda` feature; docs/worker.md "GPUs").

use std::str::FromStr;

/// A compute device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU kernels.
    #[default]
    Cpu,
    /// CUDA device number N.
    Cuda(usize),
}

impl Device {
    /// The compute pool a worker on this device registers in.
    pub fn pool(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "gpu",
        }
    }
}

impl Device {
    /// The device an environment variable names (`cpu` when unset): how the model tests are pointed at a GPU
    /// (`ZL_TEST_DEVICE=cuda:0`, scripts/gpu-check).
    pub fn from_env(name: &str) -> Result<Device, String> {
        match std::env::var(name) {
            Ok(v) if !v.is_empty() => v.parse().map_err(|e| format!("{name}: {e}")),
            _ => Ok(Device::Cpu),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("{s:?} is not a device: use cpu, cuda or cuda:N")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("cuda:x".parse::<Device>().is_err() && "gpu".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
        assert_eq!((Device::Cpu.pool(), Device::Cuda(0).pool()), ("cpu", "gpu"));
    }
}
