//! Layout requests (`setstripe` arguments, directory defaults) and their instantiation
//! into concrete layouts by choosing OSTs.

use serde::{Deserialize, Serialize};

use crate::{check_stripe_size, Component, Layout, LayoutError, Pattern, EOF, STRIPE_COUNT_MAX};

/// What one component asks for. `None` fields are taken from a fallback spec (the
/// parent directory's default, then the file system's root default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentSpec {
    /// Exclusive end of the extent; [`EOF`] for the last component.
    pub extent_end: u64,
    /// `-1` = all OSTs.
    pub stripe_count: Option<i64>,
    pub stripe_size: Option<u64>,
    /// Index of the first OST (`setstripe -i`).
    pub stripe_offset: Option<u32>,
    /// Explicit OSTs (`setstripe -o`), in stripe order.
    pub ost_list: Option<Vec<u32>>,
    pub pool: Option<String>,
}

/// A requested layout: one or more components by extent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutSpec {
    pub components: Vec<ComponentSpec>,
}

/// What the placement needs to know of one OST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OstState {
    pub index: u32,
    pub up: bool,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

impl LayoutSpec {
    /// A one-component RAID-0 request.
    pub fn raid0(stripe_count: Option<i64>, stripe_size: Option<u64>) -> Self {
        LayoutSpec {
            components: vec![ComponentSpec { extent_end: EOF, stripe_count, stripe_size, ..Default::default() }],
        }
    }

    /// Checks what can be checked without knowing the cluster's OSTs.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.components.is_empty() {
            return Err(LayoutError::Empty);
        }
        if self.components.len() > 64 {
            return Err(LayoutError::TooManyComponents(self.components.len()));
        }
        let mut start = 0u64;
        for c in &self.components {
            if c.extent_end <= start {
                return Err(LayoutError::Extents(format!(
                    "extent end {} is not above the previous end {}",
                    c.extent_end, start
                )));
            }
            start = c.extent_end;
            if let Some(s) = c.stripe_size {
                check_stripe_size(s)?;
            }
            if let Some(n) = c.stripe_count {
                if n == 0 || n < -1 || n > STRIPE_COUNT_MAX as i64 {
                    return Err(LayoutError::StripeCount(n));
                }
            }
            if let Some(list) = &c.ost_list {
                let mut seen = std::collections::HashSet::new();
                for &o in list {
                    if !seen.insert(o) {
                        return Err(LayoutError::DuplicateOst(o));
                    }
                }
                if let Some(n) = c.stripe_count {
                    if n > list.len() as i64 {
                        return Err(LayoutError::CountExceedsList { count: n, list: list.len() });
                    }
                }
            }
        }
        if start != EOF {
            return Err(LayoutError::Extents("the last component must extend to EOF (-E -1)".into()));
        }
        Ok(())
    }

    /// Fills unset fields from `fallback`. A one-component fallback applies to every
    /// component; otherwise components are matched by position.
    pub fn inherit(&self, fallback: &LayoutSpec) -> LayoutSpec {
        let components = self
            .components
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let f = fallback.components.get(i).or_else(|| fallback.components.last()).cloned().unwrap_or_default();
                ComponentSpec {
                    extent_end: c.extent_end,
                    stripe_count: c.stripe_count.or(if c.ost_list.is_some() { None } else { f.stripe_count }),
                    stripe_size: c.stripe_size.or(f.stripe_size),
                    stripe_offset: c.stripe_offset.or(if c.ost_list.is_some() { None } else { f.stripe_offset }),
                    ost_list: c.ost_list.clone().or(f.ost_list),
                    pool: c.pool.clone().or(f.pool),
                }
            })
            .collect();
        LayoutSpec { components }
    }

    /// Turns a (fully inherited) spec into a layout. The first component is instantiated
    /// now; later ones too (PFL's lazy instantiation comes with its own capability).
    /// `cursor` is the round-robin position, advanced by the caller per file.
    pub fn instantiate(&self, osts: &[OstState], cursor: u64) -> Result<Layout, PlacementError> {
        self.validate()?;
        let mut components = Vec::with_capacity(self.components.len());
        let mut start = 0;
        for (i, c) in self.components.iter().enumerate() {
            let stripe_size = c.stripe_size.unwrap_or(1 << 20);
            let chosen = choose_osts(c, osts, cursor.wrapping_add(i as u64))?;
            components.push(Component {
                id: i as u32 + 1,
                extent_start: start,
                extent_end: c.extent_end,
                pattern: Pattern::Raid0,
                stripe_size,
                stripe_count_wanted: c.stripe_count.unwrap_or(chosen.len() as i64),
                osts: chosen,
                pool: c.pool.clone(),
            });
            start = c.extent_end;
        }
        let layout = Layout { generation: 1, components };
        layout.validate()?;
        Ok(layout)
    }
}

/// Why no OSTs could be chosen for a component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("OST index {0} does not exist in this file system")]
    NoSuchOst(u32),
    #[error("OST {0} is down")]
    OstDown(u32),
    #[error("no OST is up to place the file on")]
    NoOstUp,
}

/// Free-space imbalance above which placement weights by free space instead of plain
/// round-robin (Lustre's `qos_threshold_rr`, 17%).
const QOS_THRESHOLD_PERCENT: u64 = 17;

/// Chooses the OSTs of one component.
///
/// - explicit list: used as given (all must exist and be up), cut to the stripe count;
/// - start index: consecutive up OSTs in index order from that index;
/// - otherwise round-robin from `cursor` over up OSTs while free space is balanced,
///   and the OSTs with most free space first when it is not (Lustre's QoS allocator).
///
/// A stripe count above the number of up OSTs is reduced to it, as Lustre does.
pub fn choose_osts(spec: &ComponentSpec, osts: &[OstState], cursor: u64) -> Result<Vec<u32>, PlacementError> {
    let find = |idx: u32| osts.iter().find(|o| o.index == idx);
    if let Some(list) = &spec.ost_list {
        for &idx in list {
            match find(idx) {
                None => return Err(PlacementError::NoSuchOst(idx)),
                Some(o) if !o.up => return Err(PlacementError::OstDown(idx)),
                Some(_) => {}
            }
        }
        let n = spec.stripe_count.filter(|&n| n > 0).map_or(list.len(), |n| n as usize);
        return Ok(list[..n.min(list.len())].to_vec());
    }
    let mut up: Vec<&OstState> = osts.iter().filter(|o| o.up).collect();
    up.sort_by_key(|o| o.index);
    if up.is_empty() {
        return Err(PlacementError::NoOstUp);
    }
    let want = match spec.stripe_count.unwrap_or(1) {
        -1 => up.len(),
        n => (n.max(1) as usize).min(up.len()),
    };
    if let Some(start) = spec.stripe_offset {
        if find(start).is_none() {
            return Err(PlacementError::NoSuchOst(start));
        }
        let first = up.iter().position(|o| o.index >= start).unwrap_or(0);
        return Ok((0..want).map(|k| up[(first + k) % up.len()].index).collect());
    }
    let max_free = up.iter().map(|o| o.free_bytes).max().unwrap_or(0);
    let min_free = up.iter().map(|o| o.free_bytes).min().unwrap_or(0);
    let imbalanced = max_free > 0 && (max_free - min_free) * 100 > max_free * QOS_THRESHOLD_PERCENT;
    if imbalanced {
        // Most free space first; the cursor rotates among OSTs of equal free space.
        let mut by_free = up.clone();
        by_free.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.index.cmp(&b.index)));
        return Ok(by_free.iter().take(want).map(|o| o.index).collect());
    }
    let first = (cursor % up.len() as u64) as usize;
    Ok((0..want).map(|k| up[(first + k) % up.len()].index).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn osts(n: u32) -> Vec<OstState> {
        (0..n).map(|index| OstState { index, up: true, free_bytes: 100 << 30, total_bytes: 200 << 30 }).collect()
    }

    #[test]
    fn round_robin_rotates_and_skips_down_osts() {
        let mut t = osts(4);
        let spec = ComponentSpec { extent_end: EOF, stripe_count: Some(2), ..Default::default() };
        assert_eq!(choose_osts(&spec, &t, 0).unwrap(), vec![0, 1]);
        assert_eq!(choose_osts(&spec, &t, 3).unwrap(), vec![3, 0]);
        t[1].up = false;
        assert_eq!(choose_osts(&spec, &t, 0).unwrap(), vec![0, 2]);
        let all = ComponentSpec { stripe_count: Some(-1), ..spec.clone() };
        assert_eq!(choose_osts(&all, &t, 1).unwrap(), vec![2, 3, 0]);
    }

    #[test]
    fn imbalance_prefers_free_space() {
        let mut t = osts(4);
        t[2].free_bytes = 190 << 30;
        let spec = ComponentSpec { extent_end: EOF, stripe_count: Some(1), ..Default::default() };
        assert_eq!(choose_osts(&spec, &t, 0).unwrap(), vec![2]);
    }

    #[test]
    fn explicit_list_and_start_index() {
        let t = osts(4);
        let spec = ComponentSpec { extent_end: EOF, ost_list: Some(vec![3, 1]), ..Default::default() };
        assert_eq!(choose_osts(&spec, &t, 0).unwrap(), vec![3, 1]);
        let bad = ComponentSpec { ost_list: Some(vec![9]), ..spec.clone() };
        assert_eq!(choose_osts(&bad, &t, 0), Err(PlacementError::NoSuchOst(9)));
        let start =
            ComponentSpec { extent_end: EOF, stripe_count: Some(3), stripe_offset: Some(2), ..Default::default() };
        assert_eq!(choose_osts(&start, &t, 7).unwrap(), vec![2, 3, 0]);
        let bad = ComponentSpec { stripe_offset: Some(7), ..start };
        assert_eq!(choose_osts(&bad, &t, 0), Err(PlacementError::NoSuchOst(7)));
    }

    #[test]
    fn spec_validation() {
        let mut s = LayoutSpec::raid0(Some(2), Some(100_000));
        assert_eq!(s.validate(), Err(LayoutError::StripeSizeUnaligned(100_000)));
        s = LayoutSpec::raid0(Some(0), None);
        assert_eq!(s.validate(), Err(LayoutError::StripeCount(0)));
        s = LayoutSpec::raid0(Some(3), None);
        s.components[0].ost_list = Some(vec![0, 1]);
        assert_eq!(s.validate(), Err(LayoutError::CountExceedsList { count: 3, list: 2 }));
        s.components[0].extent_end = 4 << 20;
        s.components[0].stripe_count = None;
        assert!(matches!(s.validate(), Err(LayoutError::Extents(_))));
    }

    #[test]
    fn inherit_fills_unset_fields() {
        let root = LayoutSpec::raid0(Some(1), Some(1 << 20));
        let mine = LayoutSpec::raid0(Some(4), None);
        let full = mine.inherit(&root);
        assert_eq!(full.components[0].stripe_count, Some(4));
        assert_eq!(full.components[0].stripe_size, Some(1 << 20));
        let l = full.instantiate(&osts(4), 0).unwrap();
        assert_eq!(l.components[0].osts, vec![0, 1, 2, 3]);
    }
}
