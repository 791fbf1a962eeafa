//! Building ordered maps without `collect()`: a `BTreeMap` collected from
//! an iterator sorts its pairs first, with a merge sort compiled anew for
//! every pair type; inserting one by one reuses the map's own code (a
//! smaller download for the page, the same map).

use std::collections::BTreeMap;

/// The map of these pairs; a later pair with the same key wins, as with
/// `collect()`.
pub fn map_of<K: Ord, V>(pairs: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    let mut map = BTreeMap::new();
    map.extend(pairs);
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_map_as_collect() {
        let pairs = [(3, "c"), (1, "a"), (3, "d"), (2, "b")];
        assert_eq!(map_of(pairs), pairs.into_iter().collect::<BTreeMap<_, _>>());
    }
}
