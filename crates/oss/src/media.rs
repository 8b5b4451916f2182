//! Emulated media: an OST told to behave like a slower device, so pools, tiering and
//! the seeds' media figures can be shown on one machine.
//!
//! `braid oss --ost DIR:class=hdd,bw=150M,lat=4ms` gives OST `DIR` a class (a label
//! reports show) and limits this OSS enforces on the OST's reads and writes:
//!
//! - **bandwidth** (`bw`, bytes per second; K, M, G are binary): one token bucket per
//!   OST that reads and writes share, as they share a disk's head or a device's
//!   channels. It is kept as the moment the medium is next free: a transfer of `n`
//!   bytes starts then (or now, if later) and ends `n / bw` after, so concurrent
//!   requests queue behind each other and the OST delivers `bw` however many clients
//!   ask. No burst: an idle medium does not save up.
//! - **latency** (`lat`: `4ms`, `200us`, `1s`): added to every read and write once its
//!   transfer is done, without holding up the others (a device's access time, which
//!   many requests in flight overlap).
//!
//! Both are waits on the OSS's runtime timer, never a sleeping thread. Clients of
//! this machine that short-circuit object I/O (read and write the object files
//! themselves) would bypass the emulation: an emulated OST offers no short circuit.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use proto::msg::Media;
use tokio::time::Instant;

/// The limits of one emulated OST, and when its medium is next free.
#[derive(Debug)]
pub struct Throttle {
    media: Media,
    next_free: Mutex<Instant>,
}

impl Throttle {
    pub fn new(media: Media) -> Throttle {
        Throttle { media, next_free: Mutex::new(Instant::now()) }
    }

    pub fn media(&self) -> &Media {
        &self.media
    }

    /// Waits as the medium would take to move `bytes` (a read or a write).
    pub async fn pass(&self, bytes: u64) {
        let now = Instant::now();
        let transferred = match self.media.bw_bytes {
            Some(bw) if bw > 0 => {
                let mut next = self.next_free.lock().expect("medium clock");
                let start = (*next).max(now);
                let end = start + Duration::from_secs_f64(bytes as f64 / bw as f64);
                *next = end;
                end
            }
            _ => now,
        };
        let done = transferred + Duration::from_micros(self.media.lat_us.unwrap_or(0));
        if done > now {
            tokio::time::sleep_until(done).await;
        }
    }
}

/// An `--ost` argument: a directory, with `:key=value,...` after it for an emulated
/// medium (`class`, `bw`, `lat`; `bw` or `lat` without `class` is class `emulated`).
/// A directory whose name has a colon and no `=` after it is taken whole.
pub fn parse_ost_arg(arg: &str) -> Result<(PathBuf, Option<Media>), String> {
    let Some((dir, spec)) = arg.rsplit_once(':').filter(|(_, spec)| spec.contains('=')) else {
        return Ok((PathBuf::from(arg), None));
    };
    if dir.is_empty() {
        return Err(format!("--ost {arg}: no directory before ':'"));
    }
    let media = parse_media(spec).map_err(|e| format!("--ost {arg}: {e}"))?;
    Ok((PathBuf::from(dir), Some(media)))
}

/// A medium as `class=hdd,bw=150M,lat=4ms` gives it (`bw` or `lat` without `class`
/// is class `emulated`).
pub fn parse_media(spec: &str) -> Result<Media, String> {
    let mut media = Media::default();
    for item in spec.split(',') {
        let (key, value) = item.split_once('=').ok_or_else(|| format!("'{item}' is not key=value (class, bw, lat)"))?;
        match key.trim() {
            "class" => {
                let v = value.trim();
                if v.is_empty() || v.len() > 16 || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(format!("class '{v}' is not a short name (letters, digits, '-', '_')"));
                }
                media.class = v.to_string();
            }
            "bw" => media.bw_bytes = Some(parse_rate(value).map_err(|e| format!("bw: {e}"))?),
            "lat" => media.lat_us = Some(parse_latency(value).map_err(|e| format!("lat: {e}"))?),
            other => return Err(format!("unknown key '{other}' (class, bw, lat)")),
        }
    }
    if media.class.is_empty() {
        media.class = "emulated".to_string();
    }
    Ok(media)
}

/// `150M`, `1G`, `512K`, `1048576` (bytes per second; a trailing `/s` or `B` is
/// allowed): at least 1 KiB/s.
fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches("/s").trim_end_matches(['B', 'b']);
    let (num, unit) = t.split_at(t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len()));
    let n: f64 = num.parse().map_err(|_| format!("'{s}' is not a rate such as 150M"))?;
    let mult = match unit.to_ascii_uppercase().as_str() {
        "" => 1u64,
        "K" | "KI" => 1 << 10,
        "M" | "MI" => 1 << 20,
        "G" | "GI" => 1 << 30,
        _ => return Err(format!("'{s}': unit '{unit}' is not K, M or G")),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || !(1024.0..=1e15).contains(&bytes) {
        return Err(format!("'{s}' is outside 1K to 1P bytes per second"));
    }
    Ok(bytes as u64)
}

/// `4ms`, `250us`, `1s`, `0`: at most 10 s.
fn parse_latency(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len()));
    let n: f64 = num.parse().map_err(|_| format!("'{s}' is not a latency such as 4ms"))?;
    let us = match unit {
        "us" | "µs" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        "" if n == 0.0 => 0.0,
        _ => return Err(format!("'{s}': give a unit, us, ms or s")),
    };
    if !us.is_finite() || us > 10e6 {
        return Err(format!("'{s}' is more than 10 s"));
    }
    Ok(us as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ost_arguments_parse_with_and_without_a_medium() {
        assert_eq!(parse_ost_arg("/srv/ost0").unwrap(), (PathBuf::from("/srv/ost0"), None));
        assert_eq!(parse_ost_arg("/srv/a:b").unwrap(), (PathBuf::from("/srv/a:b"), None), "a colon in a path");
        let (dir, m) = parse_ost_arg("/srv/ost1:class=hdd,bw=150M,lat=4ms").unwrap();
        assert_eq!(dir, PathBuf::from("/srv/ost1"));
        assert_eq!(m.unwrap(), Media { class: "hdd".into(), bw_bytes: Some(150 << 20), lat_us: Some(4000) });
        let (_, m) = parse_ost_arg("d:bw=1.5G").unwrap();
        assert_eq!(m.unwrap(), Media { class: "emulated".into(), bw_bytes: Some(1536 << 20), lat_us: None });
        let (_, m) = parse_ost_arg("d:lat=250us,class=nvme").unwrap();
        assert_eq!(m.unwrap().lat_us, Some(250));
        for bad in ["d:bw=fast", "d:bw=10", "d:lat=4", "d:lat=1h", "d:speed=1M", "d:class=a b", ":bw=1M", "d:bw="] {
            assert!(parse_ost_arg(bad).is_err(), "{bad} should be refused");
        }
    }

    #[tokio::test]
    async fn bandwidth_is_shared_by_concurrent_transfers_and_latency_is_not() {
        let t = std::sync::Arc::new(Throttle::new(Media {
            class: "hdd".into(),
            bw_bytes: Some(100 << 20),
            lat_us: Some(4000),
        }));
        let start = Instant::now();
        // Four transfers of 2 MiB at once: 100 MiB/s moves them in 80 ms together,
        // one after the other; each also waits its 4 ms, overlapped with the others'.
        // (A timer never fires early, so the lower bounds hold on any machine.)
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                tokio::spawn(async move {
                    t.pass(2 << 20).await;
                    start.elapsed()
                })
            })
            .collect();
        let mut ends = Vec::new();
        for task in tasks {
            ends.push(task.await.unwrap().as_micros());
        }
        ends.sort();
        for (k, end) in ends.iter().enumerate() {
            let least = (k as u128 + 1) * 20_000 + 4_000;
            assert!(*end >= least, "transfer {k} ended after {end} us, before {least} us: {ends:?}");
        }
        // An idle medium saves nothing up: the next transfer takes its full time.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = Instant::now();
        t.pass(1 << 20).await;
        assert!(again.elapsed() >= Duration::from_millis(14), "{:?}", again.elapsed());
    }
}
