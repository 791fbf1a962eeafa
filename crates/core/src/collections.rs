//! Ordered maps and sorted lists with less code in the page: a `BTreeMap`
//! collected from an iterator sorts its pairs first, and every sort is
//! compiled anew for each element type. These build the same results by
//! inserting one by one, and by sorting one kind of list: (key, position).
//! `IdMap`: the few objects of a kind by id, in a `Vec`.

use std::collections::BTreeMap;

/// The map of these pairs; a later pair with the same key wins, as with
/// `collect()`.
pub fn map_of<K: Ord, V>(pairs: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    let mut map = BTreeMap::new();
    map.extend(pairs);
    map
}

/// Sorts `items` by a whole-number key (unstable: for keys that are
/// unique, such as addresses and ids).
pub fn sort_by_u64<T>(items: &mut Vec<T>, key: impl Fn(&T) -> u64) {
    let mut order: Vec<(u64, usize)> = items.iter().map(key).zip(0..).collect();
    order.sort_unstable();
    let mut slots: Vec<Option<T>> = items.drain(..).map(Some).collect();
    items.extend(order.into_iter().filter_map(|(_, i)| slots[i].take()));
}

/// A handful of values by object id (a `runtime::ObjId`: models,
/// optimizers, datasets): a `Vec` searched in order, the same answers as a
/// `HashMap` with a fraction of its code.
#[derive(Clone, Debug)]
pub struct IdMap<V>(Vec<(u64, V)>);

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        IdMap(Vec::new())
    }
}

impl<V> IdMap<V> {
    fn position(&self, id: u64) -> Option<usize> {
        self.0.iter().position(|(k, _)| *k == id)
    }

    pub fn get(&self, id: &u64) -> Option<&V> {
        self.position(*id).map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, id: &u64) -> Option<&mut V> {
        self.position(*id).map(|i| &mut self.0[i].1)
    }

    pub fn contains_key(&self, id: &u64) -> bool {
        self.position(*id).is_some()
    }

    /// Sets the value of `id`; the one it replaces, if any.
    pub fn insert(&mut self, id: u64, value: V) -> Option<V> {
        match self.position(id) {
            Some(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            None => {
                self.0.push((id, value));
                None
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    /// The values, mutable, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, v)| v)
    }

    /// The ids and values, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn remove(&mut self, id: &u64) -> Option<V> {
        self.position(*id).map(|i| self.0.swap_remove(i).1)
    }
}

impl<V> std::ops::Index<&u64> for IdMap<V> {
    type Output = V;
    fn index(&self, id: &u64) -> &V {
        self.get(id).expect("an id the map holds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_map_as_collect() {
        let pairs = [(3, "c"), (1, "a"), (3, "d"), (2, "b")];
        assert_eq!(map_of(pairs), pairs.into_iter().collect::<BTreeMap<_, _>>());
    }

    #[test]
    fn sorted_by_key() {
        let mut items = vec![(30, 'c'), (10, 'a'), (20, 'b'), (0, 'z')];
        sort_by_u64(&mut items, |&(k, _)| k);
        assert_eq!(items, [(0, 'z'), (10, 'a'), (20, 'b'), (30, 'c')]);
        let mut empty: Vec<(u64, char)> = Vec::new();
        sort_by_u64(&mut empty, |&(k, _)| k);
        assert!(empty.is_empty());
    }

    #[test]
    fn an_id_map_answers_as_a_hash_map() {
        let mut map = IdMap::default();
        assert_eq!(map.insert(7, "a"), None);
        assert_eq!(map.insert(3, "b"), None);
        assert_eq!(map.insert(7, "c"), Some("a"));
        assert_eq!(
            (map.get(&7), map[&3], map.contains_key(&5)),
            (Some(&"c"), "b", false)
        );
        *map.get_mut(&3).unwrap() = "d";
        assert_eq!(map.remove(&3), Some("d"));
        assert_eq!(
            (map.remove(&3), map.get(&3), map.get(&7)),
            (None, None, Some(&"c"))
        );
    }
}
