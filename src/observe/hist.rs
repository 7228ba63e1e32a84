//! A fixed-bucket histogram of wait times: the buckets Prometheus shows, so merging is
//! adding and memory is constant.

/// Upper bounds of the buckets in milliseconds; one more bucket takes the rest.
pub const BOUNDS_MS: [u64; 23] = [
    1, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000,
    600_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000, 43_200_000, 86_400_000,
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hist {
    pub counts: [u64; BOUNDS_MS.len() + 1],
    pub sum_ms: u64,
    pub count: u64,
}

impl Hist {
    #[inline]
    pub fn record_ms(&mut self, ms: u64) {
        let i = BOUNDS_MS.partition_point(|&b| b < ms);
        self.counts[i] += 1;
        // A stream entry's ID time is the client's to choose: a wait can be huge.
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.count += 1;
    }

    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.sum_ms = self.sum_ms.saturating_add(other.sum_ms);
        self.count += other.count;
    }

    /// The q-quantile in milliseconds, interpolated inside its bucket; None when empty.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q * self.count as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            if (seen + c) as f64 >= rank {
                let lo = if i == 0 { 0 } else { BOUNDS_MS[i - 1] } as f64;
                let hi = match BOUNDS_MS.get(i) {
                    Some(&b) => b as f64,
                    // The open bucket: no upper bound, report its floor.
                    None => return Some(lo),
                };
                let within = (rank - seen as f64) / c as f64;
                return Some(lo + (hi - lo) * within);
            }
            seen += c;
        }
        Some(BOUNDS_MS[BOUNDS_MS.len() - 1] as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        let mut h = Hist::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for ms in [0, 1, 2, 3, 700, 700, 700, 700, 700, 100_000_000] {
            h.record_ms(ms);
        }
        assert_eq!(h.counts[0], 2); // 0 and 1 are <= 1 ms
        assert_eq!(h.counts[1], 2); // 2 and 3
        assert_eq!(h.count, 10);
        let p50 = h.quantile_ms(0.5).unwrap();
        assert!((500.0..=1000.0).contains(&p50), "{p50}");
        let mut g = Hist::default();
        g.merge(&h);
        assert_eq!(g, h);
    }
}
