//! Ordered maps and sorted lists with less code in the page: a `BTreeMap`
//! collected from an iterator sorts its pairs first, and every sort is
//! compiled anew for each element type. These build the same results by
//! inserting one by one, and by sorting one kind of list: (key, position).

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
}
