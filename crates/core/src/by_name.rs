//! Unit enums read from their names, through one reader shared by all
//! (serde's derived reader costs each enum its own visitors: about 1 KB of
//! the page's download apiece). Each enum still serializes through serde's
//! derive; `read_by_name!` lists the same names, and a test per enum holds
//! the two to each other. Errors are serde's own ("unknown variant `x`,
//! expected one of `a`, `b`").

use serde::de::{Deserialize, Deserializer, Error};

/// The position of the name read in `names`.
pub fn read<'de, D: Deserializer<'de>>(
    d: D,
    names: &'static [&'static str],
) -> Result<usize, D::Error> {
    let name = String::deserialize(d)?;
    names
        .iter()
        .position(|n| *n == name)
        .ok_or_else(|| D::Error::unknown_variant(&name, names))
}

/// `impl Deserialize` for a unit enum from its variants' names:
/// `read_by_name!(Norm { LayerNorm = "layernorm", RmsNorm = "rmsnorm" });`
#[macro_export]
macro_rules! read_by_name {
    ($t:ident { $($variant:ident = $name:literal),* $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                const NAMES: &[&str] = &[$($name),*];
                const ALL: &[$t] = &[$($t::$variant),*];
                $crate::by_name::read(d, NAMES).map(|i| ALL[i])
            }
        }

        impl $t {
            /// Every variant, for the test that holds the names to serde's
            /// (`vramlab-shared`'s `by_name_tests`).
            #[doc(hidden)]
            pub const ALL_BY_NAME: &'static [$t] = &[$($t::$variant),*];
        }
    };
}
