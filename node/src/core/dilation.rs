//! Time dilation: sim seconds per agreed (BFT) second over about the last 5 s. 1.00 at the
//! rate, lower when ticks come late (slow execution, stalls longer than a block may cover).
//! Agreed time, not this node's clock: a node catching up, or executing a block's span of
//! ticks at once, is not the sim running fast. A block's ticks come together, so one sample's
//! second alone swings around the rate; the window smooths that.

use metatopia_sim::Tick;
use std::collections::VecDeque;

/// The window, in agreed milliseconds.
const WINDOW_MS: u64 = 5_000;
/// Samples kept at most.
const SAMPLES: usize = 32;

/// (agreed time, next tick) at recent samples.
#[derive(Debug)]
pub struct Dilation {
    samples: VecDeque<(u64, Tick)>,
}

impl Dilation {
    /// Starting at agreed time `time_ms` with `next_tick` the next tick to execute.
    pub fn new(time_ms: u64, next_tick: Tick) -> Dilation {
        Dilation { samples: [(time_ms, next_tick)].into() }
    }

    /// Start over (a snapshot skipped ticks: they were not executed at the rate).
    pub fn restart(&mut self, time_ms: u64, next_tick: Tick) {
        *self = Dilation::new(time_ms, next_tick);
    }

    /// A sample: agreed time `time_ms`, `next_tick` the next tick to execute, at `rate_hz`.
    /// The dilation over the window.
    pub fn sample(&mut self, time_ms: u64, next_tick: Tick, rate_hz: u32) -> f64 {
        self.samples.push_back((time_ms, next_tick));
        while self.samples.len() > SAMPLES
            || (self.samples.len() > 2 && time_ms.saturating_sub(self.samples[1].0) >= WINDOW_MS)
        {
            self.samples.pop_front();
        }
        let (from_ms, from_tick) = self.samples[0];
        let agreed = time_ms.saturating_sub(from_ms).max(1) as f64 / 1_000.0;
        next_tick.since(from_tick) as f64 / f64::from(rate_hz.max(1)) / agreed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_000_000_000; // agreed time at a real-looking clock, ms

    /// At the rate: 1.00, whether ticks come one by one or a block's span at once; half the
    /// ticks: 0.50; a pause drags the window's figure down, then the window forgets it.
    #[test]
    fn dilation_is_sim_seconds_per_agreed_second_over_the_window() {
        let mut d = Dilation::new(T0, Tick(0));
        let mut last = 0.0;
        for s in 1..=10u64 {
            last = d.sample(T0 + s * 1_000, Tick(s * 20), 20);
        }
        assert!((last - 1.0).abs() < 1e-9, "{last}");
        // Half the ticks a second.
        for s in 11..=20u64 {
            last = d.sample(T0 + s * 1_000, Tick(200 + (s - 10) * 10), 20);
        }
        assert!((last - 0.5).abs() < 1e-9, "{last}");
        // Back at the rate: the window forgets the slow seconds.
        for s in 21..=30u64 {
            last = d.sample(T0 + s * 1_000, Tick(300 + (s - 20) * 20), 20);
        }
        assert!((last - 1.0).abs() < 1e-9, "{last}");
        d.restart(T0 + 31_000, Tick(10_000));
        let after = d.sample(T0 + 32_000, Tick(10_020), 20);
        assert!((after - 1.0).abs() < 1e-9, "the skipped ticks do not count: {after}");
    }
}
