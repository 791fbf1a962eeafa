//! The web app inside the binary (`src/webapp.rs`) is read from `../../dist`
//! at compile time: rebuild when that folder changes, also when it did not
//! exist at the last build.

fn main() {
    println!("cargo:rerun-if-changed=../../dist");
    println!("cargo:rerun-if-changed=build.rs");
}
