//! Load shapes: a closed loop of N clients, each sending its next request when its last one ends, an open loop
//! of Poisson arrivals at R requests per second, whatever the endpoint's speed (an overloaded endpoint's queue then
//! shows in TTFT, as users would feel it), or a trace's own arrivals, sped up S times. Each level is bounded by a
//! request count and, optionally, a duration.

use std::fmt;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zl_common::rng::SplitMix;

/// A load level's shape.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Shape {
    /// `clients` concurrent clients.
    Closed {
        /// Concurrent clients.
        clients: usize,
    },
    /// Sessions start at Poisson arrivals at `rate` per second.
    Open {
        /// Mean arrivals per second.
        rate: f64,
    },
    /// Sessions start at a trace's arrival times, `speed` times faster.
    Replay {
        /// The speed-up.
        speed: f64,
    },
}

impl Shape {
    /// The offered load as one number: clients, or requests per second (the x axis of the plots).
    pub fn level(&self) -> f64 {
        match *self {
            Shape::Closed { clients } => clients as f64,
            Shape::Open { rate } => rate,
            Shape::Replay { speed } => speed,
        }
    }

    /// The axis label for [`Shape::level`].
    pub fn axis(&self) -> &'static str {
        match self {
            Shape::Closed { .. } => "concurrent clients",
            Shape::Open { .. } => "offered load (requests/s)",
            Shape::Replay { .. } => "trace speed-up",
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Closed { clients: 1 } => write!(f, "1 client"),
            Shape::Closed { clients } => write!(f, "{clients} clients"),
            Shape::Open { rate } => write!(f, "{rate} req/s"),
            Shape::Replay { speed } => write!(f, "trace x{speed}"),
        }
    }
}

/// Parse a sweep: `--concurrency 1,2,4`, `--rate 0.5,1,2` or `--replay-speed 1,2`.
pub fn sweep(concurrency: Option<&str>, rate: Option<&str>, replay: Option<&str>) -> Result<Vec<Shape>> {
    let list = |s: &str, what: &str| -> Result<Vec<f64>> {
        s.split(',')
            .map(|x| {
                let v: f64 = x.trim().parse().with_context(|| format!("{what} {s:?}: {x:?} is not a number"))?;
                if !(v.is_finite() && v > 0.0) {
                    bail!("{what} {s:?}: every level must be above 0");
                }
                Ok(v)
            })
            .collect()
    };
    if let Some(s) = replay {
        if concurrency.is_some() || rate.is_some() {
            bail!("--replay-speed replays a trace's arrivals: no --concurrency or --rate with it");
        }
        return Ok(list(s, "--replay-speed")?.into_iter().map(|speed| Shape::Replay { speed }).collect());
    }
    match (concurrency, rate) {
        (Some(_), Some(_)) => bail!("give --concurrency (closed loop) or --rate (open loop), not both"),
        (None, Some(r)) => Ok(list(r, "--rate")?.into_iter().map(|rate| Shape::Open { rate }).collect()),
        (c, None) => {
            let levels = list(c.unwrap_or("1"), "--concurrency")?;
            if levels.iter().any(|c| c.fract() != 0.0 || *c > 100_000.0) {
                bail!("--concurrency: whole numbers of clients, please");
            }
            Ok(levels.into_iter().map(|c| Shape::Closed { clients: c as usize }).collect())
        }
    }
}

/// The first `n` arrival times (seconds from the start) of a Poisson process at `rate` per second, seeded.
pub fn arrivals(rate: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix::new(seed ^ 0x4152_5249_5645);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += rng.exponential(1.0 / rate);
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_parse() {
        assert_eq!(sweep(None, None, None).unwrap(), vec![Shape::Closed { clients: 1 }]);
        assert_eq!(
            sweep(None, None, Some("1,4")).unwrap(),
            vec![Shape::Replay { speed: 1.0 }, Shape::Replay { speed: 4.0 }]
        );
        assert!(sweep(Some("1"), None, Some("1")).is_err() && sweep(None, None, Some("0")).is_err());
        assert_eq!(
            sweep(Some("1, 4"), None, None).unwrap(),
            vec![Shape::Closed { clients: 1 }, Shape::Closed { clients: 4 }]
        );
        assert_eq!(
            sweep(None, Some("0.5,2"), None).unwrap(),
            vec![Shape::Open { rate: 0.5 }, Shape::Open { rate: 2.0 }]
        );
        for (c, r) in
            [(Some("1"), Some("1")), (Some("0"), None), (Some("1.5"), None), (None, Some("x")), (None, Some("-1"))]
        {
            assert!(sweep(c, r, None).is_err(), "{c:?} {r:?}");
        }
        assert_eq!(Shape::Open { rate: 2.0 }.level(), 2.0);
        assert_eq!(Shape::Closed { clients: 3 }.to_string(), "3 clients");
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_are_seeded() {
        let a = arrivals(5.0, 20_000, 1);
        assert!(a.windows(2).all(|w| w[1] > w[0]));
        let rate = a.len() as f64 / a[a.len() - 1];
        assert!((rate - 5.0).abs() < 0.15, "{rate}");
        // Exponential gaps: their standard deviation equals their mean.
        let gaps: Vec<f64> = std::iter::once(a[0]).chain(a.windows(2).map(|w| w[1] - w[0])).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.05, "{sd} {mean}");
        assert_eq!(arrivals(5.0, 10, 1), a[..10].to_vec());
        assert_ne!(arrivals(5.0, 10, 2), a[..10].to_vec());
    }
}
