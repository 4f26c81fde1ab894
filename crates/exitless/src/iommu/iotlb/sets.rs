//! A set-associative array of cache entries, as hardware builds its IOTLB (VT-d §6.2 leaves
//! the organisation to the implementation): a key picks one set by its low bits, and only
//! that set's few ways are searched, so a lookup costs a handful of compares whatever the
//! capacity. It is allocated once; lookups, inserts and evictions move entries inside it and
//! never allocate.
//!
//! Why set-associative rather than a fully associative LRU: a true LRU over 512 entries needs
//! a hash map and a linked list (a pointer chase and, with std's map, hashing) per lookup,
//! where a set is one short array scan. The devices' IOVAs are neighbouring pages or
//! aligned slots (Linux's and the probe's allocators hand out neighbouring ranges), which the
//! folded index spreads evenly over the sets, so a set-associative cache holds as much of
//! them as a fully associative one of the same size: 532 consecutive pages evict exactly 20
//! entries, all of the first 64 inserted (a fully associative LRU evicts the first 20), and
//! `bench iommu`'s deferred variants, whose unmapped pages wait for the flush in the IOTLB,
//! see as few evictions as with the fully associative cache this replaced. Within a set the
//! least recently used way goes first.

/// How a key picks its set: this number, folded to the set's bits.
pub trait SetIndex {
    /// A number that varies between neighbouring keys.
    fn set_index(&self) -> u64;
}

impl SetIndex for u16 {
    fn set_index(&self) -> u64 {
        u64::from(*self)
    }
}

/// (domain, page or region number): the number, its low bits mixed with the domain so that
/// two domains using the same IOVAs do not fight over the same sets.
impl SetIndex for (u16, u64) {
    fn set_index(&self) -> u64 {
        self.1 ^ u64::from(self.0)
    }
}

/// One set: its ways, most recently used first, empty ways last.
type Set<K, V, const WAYS: usize> = [Option<(K, V)>; WAYS];

/// `WAYS` entries per set.
#[derive(Debug)]
pub struct SetAssociative<K, V, const WAYS: usize> {
    sets: Box<[Set<K, V, WAYS>]>,
    evictions: u64,
}

impl<K: SetIndex + Copy + Eq, V: Copy, const WAYS: usize> SetAssociative<K, V, WAYS> {
    /// `entries` entries in all: a power of two sets of `WAYS`.
    pub fn new(entries: usize) -> Self {
        let sets = entries / WAYS;
        assert!(sets.is_power_of_two() && sets > 1 && sets * WAYS == entries);
        SetAssociative {
            sets: vec![[None; WAYS]; sets].into_boxed_slice(),
            evictions: 0,
        }
    }

    /// The set of `key`, and the way that holds it, if one does.
    fn find(&mut self, key: &K) -> (&mut Set<K, V, WAYS>, Option<usize>) {
        let bits = self.sets.len().trailing_zeros();
        // Every group of `bits` bits of the number takes part (XOR-folded), so that keys a
        // power of two apart (the probe's IOVA slots are 8 pages, aligned) spread over all
        // the sets instead of a few.
        let (mut rest, mut folded) = (key.set_index(), 0);
        while rest != 0 {
            folded ^= rest;
            rest >>= bits;
        }
        // The mask keeps the index below the number of sets, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let set = &mut self.sets[(folded & ((1 << bits) - 1)) as usize];
        let way = set
            .iter()
            .map_while(|e| e.as_ref())
            .position(|(k, _)| k == key);
        (set, way)
    }

    /// The entry of `key`, then the most recently used of its set.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let (set, way) = self.find(key);
        let way = way?;
        set[..=way].rotate_right(1);
        set[0].map(|(_, v)| v)
    }

    /// Put `value` under `key`, replacing its entry, or in an empty way, or in place of the
    /// least recently used entry of the set (an eviction).
    pub fn insert(&mut self, key: K, value: V) {
        let (set, way) = self.find(&key);
        let way = way.unwrap_or_else(|| set.iter().position(Option::is_none).unwrap_or(WAYS - 1));
        let evicted = set[way].is_some_and(|(k, _)| k != key);
        set[way] = Some((key, value));
        set[..=way].rotate_right(1);
        if evicted {
            self.evictions += 1;
        }
    }

    /// Remove the entry of `key`; returns it.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (set, way) = self.find(key);
        let way = way?;
        let (_, v) = set[way].take()?;
        set[way..].rotate_left(1);
        Some(v)
    }

    /// Remove every entry `pick` picks, handing each to `dropped`.
    pub fn remove_where(&mut self, pick: impl Fn(&K, &V) -> bool, mut dropped: impl FnMut(K, V)) {
        for set in self.sets.iter_mut() {
            let mut kept = 0;
            for way in 0..WAYS {
                match set[way].take() {
                    Some((k, v)) if pick(&k, &v) => dropped(k, v),
                    Some(entry) => {
                        set[kept] = Some(entry);
                        kept += 1;
                    }
                    None => break,
                }
            }
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.sets.iter().flatten().filter(|e| e.is_some()).count()
    }

    /// Entries dropped to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}
