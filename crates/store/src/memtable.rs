//! Changes not yet written to the database, held in memory in front of it.
//!
//! With the redo log ([`crate::wal`]) holding every change, the database need not be
//! committed for each batch of operations: a redb commit, even without fsync,
//! rewrites and checksums every B-tree page a batch touched, and was most of what a
//! metadata operation cost. The owner applies a batch's changes here (readers see
//! them at once), appends them to the log, and at a checkpoint writes everything held
//! here into the database in one durable transaction and empties the table.
//!
//! A read looks here first — a value, or a tombstone hiding the database's value —
//! and only then in the database; a scan merges the two in key order ([`Merge`]).
//! This is the memtable of a log-structured merge tree, with redb as its one level.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;

/// What a key held in the table before a change: nothing, a tombstone, or a value.
/// [`MemTable::restore`] puts it back (a batch that failed is undone this way).
pub type Prior = Option<Option<Vec<u8>>>;

/// Changes by table (a small index chosen by the owner) and key; `None` is a deletion.
#[derive(Debug, Default)]
pub struct MemTable {
    tables: Vec<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Bytes of keys and values held, to checkpoint before memory runs away.
    bytes: usize,
}

impl MemTable {
    pub fn new(tables: usize) -> MemTable {
        MemTable { tables: (0..tables).map(|_| BTreeMap::new()).collect(), bytes: 0 }
    }

    /// This table's entry for `key`: `None` when the database decides, `Some(None)`
    /// when the key was deleted.
    pub fn get(&self, table: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        self.tables[table].get(key).map(Option::as_deref)
    }

    /// Sets `key` to `value` (`None`: deleted); returns what the table held before.
    pub fn set(&mut self, table: usize, key: &[u8], value: Option<&[u8]>) -> Prior {
        let added = key.len() + value.map_or(0, <[u8]>::len);
        let prior = self.tables[table].insert(key.to_vec(), value.map(<[u8]>::to_vec));
        self.bytes += added;
        if let Some(p) = &prior {
            self.bytes -= key.len() + p.as_ref().map_or(0, Vec::len);
        }
        prior
    }

    /// Puts back what [`MemTable::set`] returned for `key`.
    pub fn restore(&mut self, table: usize, key: &[u8], prior: Prior) {
        let size = |v: &Option<Vec<u8>>| key.len() + v.as_ref().map_or(0, Vec::len);
        let t = &mut self.tables[table];
        if let Some(current) = t.get(key) {
            self.bytes -= size(current);
        }
        match prior {
            Some(v) => {
                self.bytes += size(&v);
                t.insert(key.to_vec(), v);
            }
            None => {
                t.remove(key);
            }
        }
    }

    /// Entries of `table` from `from` on, in key order.
    pub fn range<'a>(
        &'a self,
        table: usize,
        from: Bound<&[u8]>,
    ) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        self.tables[table].range::<[u8], _>((from, Bound::Unbounded)).map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Every entry, table by table: what a checkpoint writes to the database.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u8], Option<&[u8]>)> {
        self.tables.iter().enumerate().flat_map(|(t, m)| m.iter().map(move |(k, v)| (t, k.as_slice(), v.as_deref())))
    }

    /// Keys held, deletions included.
    pub fn len(&self) -> usize {
        self.tables.iter().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(BTreeMap::is_empty)
    }

    /// Bytes of the keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets everything (the database now holds it).
    pub fn clear(&mut self) {
        self.tables.iter_mut().for_each(BTreeMap::clear);
        self.bytes = 0;
    }
}

/// The rows of a database scan (in key order) seen through a memtable's entries for
/// the same range: where both hold a key the memtable wins, and a tombstone hides it.
pub struct Merge<'a, B: Iterator, M: Iterator<Item = (&'a [u8], Option<&'a [u8]>)>> {
    base: Peekable<B>,
    mem: Peekable<M>,
}

impl<'a, B, M, E> Merge<'a, B, M>
where
    B: Iterator<Item = Result<(Vec<u8>, Vec<u8>), E>>,
    M: Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
{
    pub fn new(base: B, mem: M) -> Self {
        Merge { base: base.peekable(), mem: mem.peekable() }
    }
}

impl<'a, B, M, E> Iterator for Merge<'a, B, M>
where
    B: Iterator<Item = Result<(Vec<u8>, Vec<u8>), E>>,
    M: Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
{
    type Item = Result<(Vec<u8>, Vec<u8>), E>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.base.peek(), self.mem.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.base.next(),
                (Some(Ok(_)), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some(Ok((bk, _))), Some((mk, _))) => bk.as_slice().cmp(mk),
            };
            if order == std::cmp::Ordering::Less {
                return self.base.next();
            }
            if order == std::cmp::Ordering::Equal {
                self.base.next();
            }
            let (k, v) = self.mem.next().expect("peeked");
            if let Some(v) = v {
                return Some(Ok((k.to_vec(), v.to_vec())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Model = BTreeMap<Vec<u8>, Vec<u8>>;

    /// The merged view of `base` under `mem`'s table 0 from `from` on.
    fn merged(base: &Model, mem: &MemTable, from: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let rows = base
            .range::<[u8], _>((Bound::Included(from), Bound::Unbounded))
            .map(|(k, v)| Ok::<_, ()>((k.clone(), v.clone())));
        Merge::new(rows, mem.range(0, Bound::Included(from))).map(|r| r.expect("no base errors")).collect()
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u8..4, 0..3)
    }

    proptest! {
        /// Any sequence of sets and deletions over any database content reads back as
        /// the same sequence applied to a plain map; undoing a suffix of them restores
        /// the earlier view; and the byte count stays what the table holds.
        #[test]
        fn reads_through_the_table_equal_the_changes_applied_to_the_database(
            base in prop::collection::btree_map(key(), key(), 0..12),
            ops in prop::collection::vec((key(), prop::option::of(key())), 0..40),
            undo in 0usize..40,
            from in key(),
        ) {
            let mut mem = MemTable::new(2);
            let mut model = base.clone();
            let mut history = Vec::new();
            let mut snapshots = vec![model.clone()];
            for (k, v) in &ops {
                history.push((k.clone(), mem.set(0, k, v.as_deref())));
                match v {
                    Some(v) => model.insert(k.clone(), v.clone()),
                    None => model.remove(k),
                };
                snapshots.push(model.clone());
            }
            let want: Vec<_> = model.range::<[u8], _>((Bound::Included(from.as_slice()), Bound::Unbounded))
                .map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(merged(&base, &mem, &from), want);
            for (k, v) in &model {
                let got = match mem.get(0, k) { Some(Some(v)) => Some(v.to_vec()), Some(None) => None, None => base.get(k).cloned() };
                prop_assert_eq!(got.as_ref(), Some(v));
            }
            prop_assert!(mem.get(1, b"").is_none(), "other tables untouched");

            let undo = undo.min(history.len());
            for (k, prior) in history.drain(history.len() - undo..).rev() {
                mem.restore(0, &k, prior);
            }
            let earlier = &snapshots[snapshots.len() - 1 - undo];
            let want: Vec<_> = earlier.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            prop_assert_eq!(merged(&base, &mem, &[]), want);
            let held: usize = mem.iter().map(|(_, k, v)| k.len() + v.map_or(0, <[u8]>::len)).sum();
            prop_assert_eq!(mem.bytes(), held);
        }
    }

    #[test]
    fn a_base_error_is_passed_on_in_its_place() {
        let mut mem = MemTable::new(1);
        mem.set(0, b"b", Some(b"mem"));
        let rows = vec![Ok((b"a".to_vec(), b"1".to_vec())), Err("disk"), Ok((b"c".to_vec(), b"3".to_vec()))];
        let out: Vec<_> = Merge::new(rows.into_iter(), mem.range(0, Bound::Unbounded)).collect();
        assert_eq!(
            out,
            vec![
                Ok((b"a".to_vec(), b"1".to_vec())),
                Err("disk"),
                Ok((b"b".to_vec(), b"mem".to_vec())),
                Ok((b"c".to_vec(), b"3".to_vec())),
            ]
        );
        mem.clear();
        assert!(mem.is_empty());
        assert_eq!((mem.len(), mem.bytes()), (0, 0));
    }
}
