//! Layout requests (`setstripe` arguments, directory defaults) and their instantiation
//! into concrete layouts by choosing OSTs.

use serde::{Deserialize, Serialize};

use crate::{
    check_stripe_size, Component, Layout, LayoutError, Pattern, COMPONENTS_MAX, DOM_SIZE_MAX, EOF, STRIPE_COUNT_MAX,
    STRIPE_SIZE_UNIT,
};

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
    /// `-L`: striped over OSTs, or kept on the MDT (Data-on-MDT, first component only).
    pub pattern: Pattern,
}

/// A requested layout: one or more components by extent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutSpec {
    pub components: Vec<ComponentSpec>,
}

/// A change to the layout of an existing file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayoutChange {
    /// Choose OSTs for every component that starts below `end` and has none: what a
    /// write or truncate reaching `end` needs (Lustre's layout intent).
    Instantiate { end: u64 },
    /// Append components after the last one (`setstripe --component-add`).
    AddComponents(LayoutSpec),
    /// Remove trailing components that are not instantiated (`setstripe
    /// --component-del`): the one with this id and those after it, or, without an id,
    /// every such component at the end.
    DelComponents { id: Option<u32> },
    /// Before a write of `[start, end)` through mirror `mirror` of a mirrored file:
    /// the other mirrors' components over the range become stale (Lustre's write
    /// intent on an FLR file), persistently, before any byte is written.
    WriteIntent { mirror: u16, start: u64, end: u64 },
}

/// The names [`LayoutSpec::template`] knows.
pub const TEMPLATES: &str = "seed-table4, seed-table5";

impl ComponentSpec {
    /// What a component of a file asks for: where it ends, its stripes, its pool (a
    /// DoM component asks for no stripes, so nothing follows from it).
    fn asked_by(c: &Component) -> ComponentSpec {
        if c.is_dom() {
            return ComponentSpec { extent_end: c.extent_end, ..Default::default() };
        }
        ComponentSpec {
            extent_end: c.extent_end,
            stripe_count: Some(c.stripe_count_wanted),
            stripe_size: Some(c.stripe_size),
            pool: c.pool.clone(),
            ..Default::default()
        }
    }

    /// A Data-on-MDT component ending at `extent_end` (`-E END -L mdt`).
    pub fn dom(extent_end: u64) -> ComponentSpec {
        ComponentSpec { extent_end, pattern: Pattern::Mdt, ..Default::default() }
    }

    /// Checks this component alone, starting where the one before it ends.
    fn check(&self, start: u64) -> Result<(), LayoutError> {
        if self.pattern == Pattern::Mdt {
            if start != 0 {
                return Err(LayoutError::Dom("a DoM component (-L mdt) must be the first".into()));
            }
            if self.extent_end == EOF {
                return Err(LayoutError::Dom("a DoM component needs an end (-E SIZE), not EOF".into()));
            }
            if self.extent_end > DOM_SIZE_MAX {
                return Err(LayoutError::Dom(format!(
                    "a DoM component of {} bytes is too big (at most {DOM_SIZE_MAX})",
                    self.extent_end
                )));
            }
            if self.stripe_count.is_some() || self.stripe_offset.is_some() || self.ost_list.is_some() {
                return Err(LayoutError::Dom("a DoM component has no OSTs: no -c, -i or -o".into()));
            }
        }
        if self.extent_end <= start {
            return Err(LayoutError::Extents(format!(
                "extent end {} is not above the end of the component before it ({start})",
                self.extent_end
            )));
        }
        if self.extent_end != EOF && !self.extent_end.is_multiple_of(STRIPE_SIZE_UNIT) {
            return Err(LayoutError::ExtentUnaligned(self.extent_end));
        }
        if let Some(s) = self.stripe_size {
            check_stripe_size(s)?;
        }
        if let Some(n) = self.stripe_count {
            if n == 0 || n < -1 || n > STRIPE_COUNT_MAX as i64 {
                return Err(LayoutError::StripeCount(n));
            }
        }
        if let Some(list) = &self.ost_list {
            let mut seen = std::collections::HashSet::new();
            for &o in list {
                if !seen.insert(o) {
                    return Err(LayoutError::DuplicateOst(o));
                }
            }
            if let Some(n) = self.stripe_count {
                if n > list.len() as i64 {
                    return Err(LayoutError::CountExceedsList { count: n, list: list.len() });
                }
            }
        }
        Ok(())
    }

    /// Whether this component names its OSTs (`-i` or `-o`): such a component is
    /// instantiated when the file is made, since a component without OSTs keeps only
    /// a stripe count to place it by later.
    pub fn placed_explicitly(&self) -> bool {
        self.ost_list.is_some() || self.stripe_offset.is_some()
    }
}

/// What the placement needs to know of one OST.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OstState {
    pub index: u32,
    pub up: bool,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// The pools it is in (see `braid pool`).
    pub pools: Vec<String>,
}

impl OstState {
    fn in_pool(&self, pool: Option<&str>) -> bool {
        pool.is_none_or(|p| self.pools.iter().any(|q| q == p))
    }
}

impl LayoutSpec {
    /// A one-component RAID-0 request.
    pub fn raid0(stripe_count: Option<i64>, stripe_size: Option<u64>) -> Self {
        LayoutSpec {
            components: vec![ComponentSpec { extent_end: EOF, stripe_count, stripe_size, ..Default::default() }],
        }
    }

    /// A built-in layout by name: `seed-table4` is the PFL layout of seed 002's
    /// Table 4 (1 stripe to 4 MiB, 2 to 512 MiB, 4 to 1 GiB, 8 to 10 GiB, 16 to
    /// 100 GiB, 32 beyond, all of 1 MiB); `seed-table5` its Data-on-MDT layout of
    /// Table 5 (the first 64 KiB on the MDT, then 4 stripes of 1 MiB).
    pub fn template(name: &str) -> Result<LayoutSpec, LayoutError> {
        match name {
            "seed-table4" => {
                let ends: [(u64, i64); 6] =
                    [(4 << 20, 1), (512 << 20, 2), (1 << 30, 4), (10 << 30, 8), (100 << 30, 16), (EOF, 32)];
                let components = ends
                    .iter()
                    .map(|&(extent_end, count)| ComponentSpec {
                        extent_end,
                        stripe_count: Some(count),
                        stripe_size: Some(1 << 20),
                        ..Default::default()
                    })
                    .collect();
                Ok(LayoutSpec { components })
            }
            "seed-table5" => Ok(LayoutSpec {
                components: vec![
                    ComponentSpec::dom(64 << 10),
                    ComponentSpec {
                        extent_end: EOF,
                        stripe_count: Some(4),
                        stripe_size: Some(1 << 20),
                        ..Default::default()
                    },
                ],
            }),
            other => Err(LayoutError::UnknownTemplate(other.to_string())),
        }
    }

    /// Checks what can be checked without knowing the cluster's OSTs. An error about
    /// one component of a composite spec names it (1 for the first).
    pub fn validate(&self) -> Result<(), LayoutError> {
        self.validate_from(0)
    }

    /// As [`LayoutSpec::validate`], for components that follow one ending at `start`.
    fn validate_from(&self, start: u64) -> Result<(), LayoutError> {
        if self.components.is_empty() {
            return Err(LayoutError::Empty);
        }
        if self.components.len() > COMPONENTS_MAX {
            return Err(LayoutError::TooManyComponents(self.components.len()));
        }
        let composite = self.components.len() > 1 || start > 0;
        let mut start = start;
        for (i, c) in self.components.iter().enumerate() {
            c.check(start).map_err(|e| {
                if composite {
                    LayoutError::Component { index: i + 1, error: Box::new(e) }
                } else {
                    e
                }
            })?;
            start = c.extent_end;
        }
        Ok(())
    }

    /// Fills unset fields as Lustre does: the first component from `fallback`'s first
    /// (the directory's default, then the file system's), each later one from the
    /// component before it. OSTs named with `-i`/`-o` are not carried to later
    /// components.
    pub fn inherit(&self, fallback: &LayoutSpec) -> LayoutSpec {
        let base = fallback.components.first().cloned().unwrap_or_default();
        let mut components: Vec<ComponentSpec> = Vec::with_capacity(self.components.len());
        for (i, c) in self.components.iter().enumerate() {
            let listed = c.ost_list.is_some();
            let filled = match components.last() {
                // A DoM component takes nothing: it has no stripes.
                _ if c.pattern == Pattern::Mdt => c.clone(),
                None => ComponentSpec {
                    extent_end: c.extent_end,
                    stripe_count: c.stripe_count.or(if listed { None } else { base.stripe_count }),
                    stripe_size: c.stripe_size.or(base.stripe_size),
                    stripe_offset: c.stripe_offset.or(if listed { None } else { base.stripe_offset }),
                    ost_list: c.ost_list.clone().or(base.ost_list.clone()),
                    pool: c.pool.clone().or(base.pool.clone()),
                    pattern: c.pattern,
                },
                Some(prev) => ComponentSpec {
                    extent_end: c.extent_end,
                    stripe_count: c.stripe_count.or(if listed {
                        None
                    } else {
                        prev.stripe_count.or(base.stripe_count)
                    }),
                    stripe_size: c.stripe_size.or(prev.stripe_size).or(base.stripe_size),
                    stripe_offset: c.stripe_offset,
                    ost_list: c.ost_list.clone(),
                    pool: c.pool.clone().or(prev.pool.clone()),
                    pattern: c.pattern,
                },
            };
            debug_assert!(i == components.len());
            components.push(filled);
        }
        LayoutSpec { components }
    }

    /// Turns a (fully inherited) spec into the layout of a new file. The first
    /// component gets its OSTs now, as does any that names its OSTs; the others stay
    /// uninstantiated until a write or truncate reaches them
    /// ([`Layout::instantiate_below`]). `cursor` is the round-robin position,
    /// advanced by the caller per file.
    pub fn instantiate(&self, osts: &[OstState], cursor: u64) -> Result<Layout, PlacementError> {
        self.validate()?;
        let mut layout = Layout { generation: 1, components: Vec::with_capacity(self.components.len()), objects: None };
        layout.push_components(&self.components, 0, osts, cursor)?;
        layout.validate()?;
        Ok(layout)
    }
}

impl Layout {
    /// Appends components made from `specs`, the first starting at `start`, with ids
    /// after the largest in use. Only the first component of a file, and components
    /// that name their OSTs, are placed now.
    fn push_components(
        &mut self,
        specs: &[ComponentSpec],
        mut start: u64,
        osts: &[OstState],
        cursor: u64,
    ) -> Result<(), PlacementError> {
        let first_id = self.components.iter().map(|c| c.id).max().unwrap_or(0) + 1;
        for (i, c) in specs.iter().enumerate() {
            let id = first_id + i as u32;
            if c.pattern == Pattern::Mdt {
                self.components.push(Component {
                    id,
                    extent_start: start,
                    extent_end: c.extent_end,
                    pattern: Pattern::Mdt,
                    stripe_size: c.extent_end,
                    stripe_count_wanted: 0,
                    osts: Vec::new(),
                    pool: None,
                    mirror: 0,
                    flags: 0,
                });
                start = c.extent_end;
                continue;
            }
            let chosen = if start == 0 || c.placed_explicitly() {
                choose_osts(c, osts, cursor.wrapping_add(i as u64))?
            } else {
                Vec::new()
            };
            self.components.push(Component {
                id,
                extent_start: start,
                extent_end: c.extent_end,
                pattern: Pattern::Raid0,
                stripe_size: c.stripe_size.unwrap_or(1 << 20),
                stripe_count_wanted: c.stripe_count.unwrap_or(if chosen.is_empty() { 1 } else { chosen.len() as i64 }),
                osts: chosen,
                pool: c.pool.clone(),
                mirror: 0,
                flags: 0,
            });
            start = c.extent_end;
        }
        Ok(())
    }

    /// Chooses OSTs for every component that starts below `end` and has none (a
    /// write or truncate reaching `end`), with the placement rules of a new file, and
    /// bumps the generation if any was chosen. Returns whether the layout changed;
    /// `end` past the last component is an error.
    pub fn instantiate_below(&mut self, end: u64, osts: &[OstState], cursor: u64) -> Result<bool, PlacementError> {
        if end > self.end() {
            return Err(LayoutError::BeyondLayout(self.end()).into());
        }
        let self_is_mirrored = self.is_mirrored();
        let mut changed = false;
        // (mirror, extent, OSTs) of the instantiated components of a mirrored layout.
        let mut others: Vec<(u16, u64, u64, Vec<u32>)> = match self_is_mirrored {
            true => self
                .components
                .iter()
                .filter(|c| c.is_instantiated())
                .map(|c| (c.mirror, c.extent_start, c.extent_end, c.osts.clone()))
                .collect(),
            false => Vec::new(),
        };
        for (i, c) in self.components.iter_mut().enumerate() {
            if c.extent_start >= end {
                if self_is_mirrored {
                    continue;
                }
                break;
            }
            if c.is_instantiated() {
                continue;
            }
            // A mirror's objects go where the other mirrors' of the same bytes are
            // not, while enough OSTs are left, so one OST down leaves a copy.
            let spec = ComponentSpec::asked_by(c);
            let at = cursor.wrapping_add(i as u64);
            if !self_is_mirrored {
                c.osts = choose_osts(&spec, osts, at)?;
                changed = true;
                continue;
            }
            let apart: Vec<OstState> = osts
                .iter()
                .filter(|o| {
                    !others
                        .iter()
                        .any(|(m, s, e, list)| *m != c.mirror && c.overlaps(*s, *e) && list.contains(&o.index))
                })
                .cloned()
                .collect();
            c.osts = choose_osts(&spec, &apart, at).or_else(|_| choose_osts(&spec, osts, at))?;
            others.push((c.mirror, c.extent_start, c.extent_end, c.osts.clone()));
            changed = true;
        }
        if changed {
            self.generation = self.generation.wrapping_add(1);
        }
        Ok(changed)
    }

    /// Applies a change asked of an existing file. The generation is bumped when
    /// anything changed; an impossible change is an error and changes nothing.
    pub fn apply(&mut self, change: &LayoutChange, osts: &[OstState], cursor: u64) -> Result<bool, PlacementError> {
        let mut next = self.clone();
        let changed = match change {
            LayoutChange::Instantiate { end } => return self.instantiate_below(*end, osts, cursor),
            LayoutChange::WriteIntent { mirror, start, end } => return Ok(self.mark_write(*mirror, *start, *end)?),
            LayoutChange::AddComponents(_) | LayoutChange::DelComponents { .. } if self.is_mirrored() => {
                return Err(LayoutError::Mirror(
                    "a mirrored file's components change with braid mirror extend and split".into(),
                )
                .into());
            }
            LayoutChange::AddComponents(spec) => {
                let start = self.end();
                if start == EOF {
                    return Err(LayoutError::Change(
                        "the last component already reaches EOF: nothing can follow it".into(),
                    )
                    .into());
                }
                spec.validate_from(start)?;
                if self.components.len() + spec.components.len() > COMPONENTS_MAX {
                    return Err(LayoutError::TooManyComponents(self.components.len() + spec.components.len()).into());
                }
                // New components inherit from the last one, as later components do.
                let last = self.components.last().expect("a layout has a component");
                let mut chain = vec![ComponentSpec::asked_by(last)];
                chain.extend(spec.components.iter().cloned());
                let filled = LayoutSpec { components: chain }.inherit(&LayoutSpec { components: vec![] });
                next.push_components(&filled.components[1..], start, osts, cursor)?;
                true
            }
            LayoutChange::DelComponents { id } => {
                let from = match id {
                    Some(id) => next
                        .components
                        .iter()
                        .position(|c| c.id == *id)
                        .ok_or_else(|| LayoutError::Change(format!("the file has no component with id {id}")))?,
                    None => {
                        let kept = next.components.iter().rposition(Component::is_instantiated).map_or(0, |i| i + 1);
                        if kept == next.components.len() {
                            return Err(LayoutError::Change(
                                "the file has no uninstantiated component at its end to delete".into(),
                            )
                            .into());
                        }
                        kept
                    }
                };
                if let Some(c) = next.components[from..].iter().find(|c| c.is_instantiated()) {
                    return Err(LayoutError::Change(format!(
                        "component {} is instantiated (it has objects): only uninstantiated components at the end can be deleted",
                        c.id
                    ))
                    .into());
                }
                if from == 0 {
                    return Err(LayoutError::Change("a file keeps at least one component".into()).into());
                }
                next.components.truncate(from);
                true
            }
        };
        next.validate()?;
        if changed {
            next.generation = next.generation.wrapping_add(1);
            *self = next;
        }
        Ok(changed)
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
    #[error("pool '{0}' has no OSTs (or does not exist: see `braid pool list`)")]
    EmptyPool(String),
    #[error("no OST of pool '{0}' is up")]
    NoOstUpInPool(String),
    #[error("OST index {0} is not in pool '{1}'")]
    NotInPool(u32, String),
}

/// Free-space imbalance above which placement weights by free space instead of plain
/// round-robin (Lustre's `qos_threshold_rr`, 17%).
pub const QOS_THRESHOLD_PERCENT: u64 = 17;

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
    let pool = spec.pool.as_deref();
    if let Some(list) = &spec.ost_list {
        for &idx in list {
            match find(idx) {
                None => return Err(PlacementError::NoSuchOst(idx)),
                Some(o) if !o.in_pool(pool) => {
                    return Err(PlacementError::NotInPool(idx, pool.unwrap_or_default().to_string()))
                }
                Some(o) if !o.up => return Err(PlacementError::OstDown(idx)),
                Some(_) => {}
            }
        }
        let n = spec.stripe_count.filter(|&n| n > 0).map_or(list.len(), |n| n as usize);
        return Ok(list[..n.min(list.len())].to_vec());
    }
    // A pool's component stays on the pool's OSTs.
    let members: Vec<&OstState> = osts.iter().filter(|o| o.in_pool(pool)).collect();
    if let (Some(p), true) = (pool, members.is_empty()) {
        return Err(PlacementError::EmptyPool(p.to_string()));
    }
    let mut up: Vec<&OstState> = members.into_iter().filter(|o| o.up).collect();
    up.sort_by_key(|o| o.index);
    if up.is_empty() {
        return Err(match pool {
            Some(p) => PlacementError::NoOstUpInPool(p.to_string()),
            None => PlacementError::NoOstUp,
        });
    }
    let want = match spec.stripe_count.unwrap_or(1) {
        -1 => up.len(),
        n => (n.max(1) as usize).min(up.len()),
    };
    if let Some(start) = spec.stripe_offset {
        match find(start) {
            None => return Err(PlacementError::NoSuchOst(start)),
            Some(o) if !o.in_pool(pool) => {
                return Err(PlacementError::NotInPool(start, pool.unwrap_or_default().to_string()))
            }
            Some(_) => {}
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
        (0..n)
            .map(|index| OstState { index, up: true, free_bytes: 100 << 30, total_bytes: 200 << 30, pools: vec![] })
            .collect()
    }

    #[test]
    fn a_pool_component_stays_on_the_pool_and_says_why_when_it_cannot() {
        let mut t = osts(6);
        for o in &mut t[2..5] {
            o.pools = vec!["hot".into()];
        }
        t[5].pools = vec!["cool".into(), "hot".into()];
        let hot =
            ComponentSpec { extent_end: EOF, stripe_count: Some(2), pool: Some("hot".into()), ..Default::default() };
        for cursor in 0..8 {
            let chosen = choose_osts(&hot, &t, cursor).unwrap();
            assert_eq!(chosen.len(), 2);
            assert!(chosen.iter().all(|i| (2..6).contains(i)), "cursor {cursor}: {chosen:?}");
        }
        let all = ComponentSpec { stripe_count: Some(-1), ..hot.clone() };
        assert_eq!(choose_osts(&all, &t, 0).unwrap().len(), 4, "-1 is every OST of the pool");
        let listed = ComponentSpec { ost_list: Some(vec![2, 0]), ..hot.clone() };
        assert_eq!(choose_osts(&listed, &t, 0), Err(PlacementError::NotInPool(0, "hot".into())));
        let start = ComponentSpec { stripe_offset: Some(1), ..hot.clone() };
        assert_eq!(choose_osts(&start, &t, 0), Err(PlacementError::NotInPool(1, "hot".into())));
        let start = ComponentSpec { stripe_offset: Some(4), ..hot.clone() };
        assert_eq!(choose_osts(&start, &t, 0).unwrap(), vec![4, 5]);
        let none = ComponentSpec { pool: Some("warm".into()), ..hot.clone() };
        assert_eq!(choose_osts(&none, &t, 0), Err(PlacementError::EmptyPool("warm".into())));
        t[5].up = false;
        let cool = ComponentSpec { pool: Some("cool".into()), ..hot.clone() };
        assert_eq!(choose_osts(&cool, &t, 0), Err(PlacementError::NoOstUpInPool("cool".into())));
        let plain = ComponentSpec { pool: None, ..hot };
        assert_eq!(choose_osts(&plain, &t, 0).unwrap(), vec![0, 1], "no pool: any OST");
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
        s.validate().expect("a layout may end before EOF");
        s.components[0].extent_end = 100_000;
        assert_eq!(s.validate(), Err(LayoutError::ExtentUnaligned(100_000)));
    }

    fn pfl(ends: &[(u64, Option<i64>)]) -> LayoutSpec {
        LayoutSpec {
            components: ends
                .iter()
                .map(|&(extent_end, stripe_count)| ComponentSpec { extent_end, stripe_count, ..Default::default() })
                .collect(),
        }
    }

    #[test]
    fn composite_errors_name_the_component() {
        let s = pfl(&[(4 << 20, Some(1)), (2 << 20, Some(2)), (EOF, Some(4))]);
        let e = s.validate().unwrap_err();
        assert!(matches!(&e, LayoutError::Component { index: 2, .. }), "{e}");
        assert!(e.to_string().starts_with("component 2: "), "{e}");
        let s = pfl(&[(4 << 20, Some(1)), ((4 << 20) + 4096, Some(2)), (EOF, Some(4))]);
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "component 2: extent end 4198400 is not a multiple of 64 KiB"
        );
        let s = pfl(&[(4 << 20, Some(1)), (EOF, Some(0))]);
        assert!(matches!(s.validate(), Err(LayoutError::Component { index: 2, .. })));
        let many: Vec<(u64, Option<i64>)> = (1..=65).map(|i| (i << 20, Some(1))).collect();
        assert_eq!(pfl(&many).validate(), Err(LayoutError::TooManyComponents(65)));
    }

    #[test]
    fn later_components_inherit_from_the_one_before() {
        let root = LayoutSpec::raid0(Some(1), Some(4 << 20));
        let mut s = pfl(&[(4 << 20, Some(2)), (EOF, None)]);
        s.components[0].stripe_size = Some(1 << 20);
        let full = s.inherit(&root);
        assert_eq!(full.components[1].stripe_count, Some(2));
        assert_eq!(full.components[1].stripe_size, Some(1 << 20));
    }

    #[test]
    fn only_the_first_component_is_placed_at_create() {
        let t = osts(4);
        let spec = LayoutSpec::template("seed-table4").unwrap().inherit(&LayoutSpec::raid0(Some(1), Some(1 << 20)));
        let mut l = spec.instantiate(&t, 0).unwrap();
        assert_eq!(l.components.len(), 6);
        assert_eq!(l.components[0].osts.len(), 1);
        assert!(l.components[1..].iter().all(|c| !c.is_instantiated()));
        assert_eq!(l.generation, 1);
        // A write reaching 600 MiB places components 2 and 3; component 3 asks for 4.
        assert!(l.instantiate_below(600 << 20, &t, 1).unwrap());
        assert_eq!(l.generation, 2);
        assert_eq!(l.components[1].osts.len(), 2);
        assert_eq!(l.components[2].osts.len(), 4);
        assert!(!l.components[3].is_instantiated());
        // Again: nothing to do, the generation stays.
        assert!(!l.instantiate_below(600 << 20, &t, 2).unwrap());
        assert_eq!(l.generation, 2);
        // 32 stripes asked, 4 OSTs: all of them, as Lustre does.
        l.instantiate_below(EOF, &t, 3).unwrap();
        assert_eq!(l.components[5].osts.len(), 4);
        assert_eq!(l.components[5].stripe_count_wanted, 32);
        assert_eq!(LayoutSpec::template("nope"), Err(LayoutError::UnknownTemplate("nope".into())));
        let t5 = LayoutSpec::template("seed-table5").unwrap();
        t5.validate().unwrap();
        assert_eq!((t5.components[0].pattern, t5.components[0].extent_end), (Pattern::Mdt, 64 << 10));
    }

    #[test]
    fn a_dom_component_is_first_has_no_osts_and_maps_to_the_file_offsets() {
        let t = osts(4);
        let mut spec = pfl(&[(64 << 10, None), (EOF, Some(4))]);
        spec.components[0] = ComponentSpec::dom(64 << 10);
        let full = spec.inherit(&LayoutSpec::raid0(Some(1), Some(1 << 20)));
        assert_eq!(full.components[0], ComponentSpec::dom(64 << 10), "DoM takes nothing from the default");
        let mut l = full.instantiate(&t, 0).unwrap();
        assert_eq!(l.dom_end(), Some(64 << 10));
        assert!(l.components[0].is_instantiated() && l.components[0].osts.is_empty());
        assert!(!l.components[1].is_instantiated(), "a file within its DoM component has no OST objects");
        let chunks = l.chunks(1000, 2000).unwrap();
        assert_eq!((chunks.len(), chunks[0].ost, chunks[0].object_offset), (1, None, 1000));
        assert_eq!(l.chunks(60 << 10, 8 << 10), Err(LayoutError::NotInstantiated(2)));
        l.instantiate_below(128 << 10, &t, 0).unwrap();
        let chunks = l.chunks(60 << 10, 8 << 10).unwrap();
        let pieces: Vec<(bool, u64)> = chunks.iter().map(|c| (c.ost.is_none(), c.len)).collect();
        assert_eq!(pieces, [(true, 4 << 10), (false, 4 << 10)]);
        assert_eq!(l.components[0].object_size_for_file_size(0, 10), 10);
        assert_eq!(l.components[0].object_size_for_file_size(0, 1 << 20), 64 << 10);
        // The rules: first only, an end, no stripes, not too big.
        let mut late = pfl(&[(1 << 20, Some(1)), (2 << 20, None), (EOF, Some(2))]);
        late.components[1] = ComponentSpec::dom(2 << 20);
        let e = late.validate().unwrap_err().to_string();
        assert!(e.contains("component 2") && e.contains("must be the first"), "{e}");
        assert!(LayoutSpec { components: vec![ComponentSpec::dom(EOF)] }.validate().is_err());
        let striped = ComponentSpec { stripe_count: Some(2), ..ComponentSpec::dom(1 << 20) };
        assert!(LayoutSpec { components: vec![striped] }.validate().is_err());
        assert!(LayoutSpec { components: vec![ComponentSpec::dom(2 << 30)] }.validate().is_err());
        LayoutSpec { components: vec![ComponentSpec::dom(1 << 20)] }.validate().expect("a DoM-only layout");
    }

    #[test]
    fn components_are_added_and_deleted_at_the_end() {
        let t = osts(4);
        let mut l = pfl(&[(4 << 20, Some(1)), (64 << 20, Some(2))]).instantiate(&t, 0).unwrap();
        assert_eq!(l.end(), 64 << 20);
        assert!(l.instantiate_below((64 << 20) + 1, &t, 0).is_err(), "past the last component");
        let add = pfl(&[(EOF, Some(4))]);
        assert!(l.apply(&LayoutChange::AddComponents(add.clone()), &t, 0).unwrap());
        assert_eq!((l.components.len(), l.end(), l.components[2].id, l.generation), (3, EOF, 3, 2));
        assert!(!l.components[2].is_instantiated());
        let again = l.apply(&LayoutChange::AddComponents(add), &t, 0).unwrap_err();
        assert!(again.to_string().contains("already reaches EOF"), "{again}");
        // Deleting: the trailing uninstantiated ones only, never an instantiated one.
        let before = l.clone();
        assert!(l.apply(&LayoutChange::DelComponents { id: Some(1) }, &t, 0).is_err());
        assert_eq!(l, before, "a refused change changes nothing");
        assert!(l.apply(&LayoutChange::DelComponents { id: None }, &t, 0).unwrap());
        assert_eq!(l.components.len(), 1);
        assert!(l.apply(&LayoutChange::DelComponents { id: None }, &t, 0).is_err());
        // A bad extent in an added component names the component.
        let bad = pfl(&[(2 << 20, Some(1))]);
        let e = l.apply(&LayoutChange::AddComponents(bad), &t, 0).unwrap_err();
        assert!(e.to_string().contains("component 1"), "{e}");
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
