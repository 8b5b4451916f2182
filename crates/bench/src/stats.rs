//! Summary statistics over iterations, as IOR and mdtest print them: max, min, mean and the
//! population standard deviation (IOR divides by N, not N-1).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub max: f64,
    pub min: f64,
    pub mean: f64,
    pub stddev: f64,
    pub count: usize,
}

impl Summary {
    /// Statistics of `values`; all zero for an empty slice.
    pub fn of(values: &[f64]) -> Summary {
        if values.is_empty() {
            return Summary { max: 0.0, min: 0.0, mean: 0.0, stddev: 0.0, count: 0 };
        }
        let count = values.len();
        let mean = values.iter().sum::<f64>() / count as f64;
        let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / count as f64;
        Summary {
            max: values.iter().copied().fold(f64::MIN, f64::max),
            min: values.iter().copied().fold(f64::MAX, f64::min),
            mean,
            stddev: variance.sqrt(),
            count,
        }
    }
}

/// Bytes-or-items per second over a phase that ran from the first task's start to the last
/// task's end.
pub fn rate(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        amount / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_hand_computed_values() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.max, 9.0);
        assert_eq!(s.min, 2.0);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.stddev, 2.0);
        assert_eq!(s.count, 8);
    }

    #[test]
    fn single_and_empty() {
        let one = Summary::of(&[3.5]);
        assert_eq!((one.max, one.min, one.mean, one.stddev), (3.5, 3.5, 3.5, 0.0));
        let none = Summary::of(&[]);
        assert_eq!((none.max, none.mean, none.count), (0.0, 0.0, 0));
        assert_eq!(rate(10.0, 0.0), 0.0);
        assert_eq!(rate(10.0, 2.0), 5.0);
    }
}
