//! A dozen published model shapes shipped as data (`known.json`: the
//! config.json fields that decide memory, each with the link to the file
//! it copies; numbers only, no weights).

use super::config::HfConfig;
use serde_json::Value;

const KNOWN: &str = include_str!("known.json");

/// A published shape.
#[derive(Clone, Debug)]
pub struct Known {
    pub name: String,
    pub config_url: String,
    pub config: HfConfig,
}

impl Known {
    /// Its Hugging Face repository (`meta-llama/Llama-3.1-8B`), from the
    /// address of the config.json it copies.
    pub fn repo(&self) -> String {
        let path = self
            .config_url
            .trim_start_matches("https://huggingface.co/");
        path.split("/blob/").next().unwrap_or(path).to_string()
    }
}

/// Every shipped shape, in the file's order.
pub fn all() -> Vec<Known> {
    let rows: Vec<Value> = serde_json::from_str(KNOWN).unwrap_or_default();
    rows.into_iter()
        .filter_map(|r| {
            let config = HfConfig::read(&r["config"]).ok()?;
            Some(Known {
                name: r["name"].as_str()?.to_string(),
                config_url: r["config_url"].as_str()?.to_string(),
                config,
            })
        })
        .collect()
}

/// The shape named `name` (any case; `meta-llama/Llama-3.1-8B` finds
/// `Llama-3.1-8B`).
pub fn find(name: &str) -> Option<Known> {
    let short = name.rsplit('/').next().unwrap_or(name);
    all()
        .into_iter()
        .find(|k| k.name.eq_ignore_ascii_case(short))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_shipped_shape_reads() {
        let all = super::all();
        assert_eq!(all.len(), 12);
        assert!(all
            .iter()
            .all(|k| k.config_url.starts_with("https://huggingface.co/")));
        assert_eq!(
            super::find("meta-llama/llama-3.2-1b").unwrap().name,
            "Llama-3.2-1B"
        );
        assert!(super::find("Llama-9").is_none());
    }
}
