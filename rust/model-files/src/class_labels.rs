//! The class names of a classifier, which `/classify` answers as the best
//! class's `label`: vLLM 0.33 takes them from the checkpoint's `config.json`
//! (`hf_config.id2label`), and where a checkpoint names none transformers
//! names class `n` `LABEL_<n>`. A GGUF has no `config.json` (its rebuilt
//! tokenizer folder holds none), so its classes keep those default names.

use crate::generation_config::read_json;
use crate::{served_model_dir, HubCache};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use vllm_rs_config::error::ExitError;
use vllm_rs_config::{ModelTask, ServerConfig};

/// The file holding `id2label`.
const MODEL_CONFIG_FILE: &str = "config.json";

/// A classifier's class names by class index (`id2label`); classes it does
/// not name are `LABEL_<n>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassLabels(HashMap<usize, String>);

impl ClassLabels {
    /// The class names of the server's model when it classifies (`runner`
    /// `pooling`, `convert` `classify`), read from its folder as the
    /// generation config is; none for any other model, a built-in one, or
    /// one whose folder cannot be found (logged).
    pub fn for_server(config: &ServerConfig, hub: &HubCache) -> Result<Self, ExitError> {
        if config.task != ModelTask::Classify {
            return Ok(ClassLabels::default());
        }
        match served_model_dir(config, hub, "class labels") {
            Some(dir) => ClassLabels::read(&dir),
            None => Ok(ClassLabels::default()),
        }
    }

    /// The `id2label` of `dir`'s `config.json`; none when the file or the
    /// key is missing (or null). A file that is not a JSON object, an
    /// `id2label` that is not an object, a key that is not a class index
    /// (transformers refuses to load those too) or a name that is not a
    /// string is a usage error naming the file.
    pub fn read(dir: &Path) -> Result<Self, ExitError> {
        let path = dir.join(MODEL_CONFIG_FILE);
        let Some(config) = read_json(&path)? else { return Ok(ClassLabels::default()) };
        let wrong = |what: String| ExitError::usage(format!("{}: `id2label` {what}", path.display()));
        let names = match config.get("id2label") {
            None | Some(Value::Null) => return Ok(ClassLabels::default()),
            Some(Value::Object(names)) => names,
            Some(_) => return Err(wrong("must be an object of class indices to names".to_owned())),
        };
        let labels: ClassLabels = names
            .iter()
            .map(|(key, name)| {
                let class =
                    key.trim().parse::<usize>().map_err(|_| wrong(format!("key {key:?} is not a class index")))?;
                let name = name.as_str().ok_or_else(|| wrong(format!("name of class {key:?} is not a string")))?;
                Ok((class, name.to_owned()))
            })
            .collect::<Result<_, ExitError>>()?;
        Ok(labels)
    }

    /// The name of `class`: its `id2label` entry, else `LABEL_<class>`.
    pub fn name(&self, class: usize) -> String {
        self.0.get(&class).cloned().unwrap_or_else(|| format!("LABEL_{class}"))
    }
}

impl FromIterator<(usize, String)> for ClassLabels {
    /// Names by class index (a later name for an index replaces an earlier one).
    fn from_iter<I: IntoIterator<Item = (usize, String)>>(names: I) -> Self {
        ClassLabels(names.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn folder(name: &str, config: Option<&str>) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vllm-rs-labels-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        if let Some(text) = config {
            fs::write(dir.join(MODEL_CONFIG_FILE), text).unwrap();
        }
        dir
    }

    #[test]
    fn names_come_from_id2label_else_transformers_defaults() {
        let dir = folder("named", Some(r#"{"id2label": {"0": "negative", "2": "positive"}, "num_labels": 3}"#));
        let labels = ClassLabels::read(&dir).unwrap();
        assert_eq!(labels.name(0), "negative");
        assert_eq!(labels.name(2), "positive");
        assert_eq!(labels.name(1), "LABEL_1", "an index id2label lacks");
        fs::remove_dir_all(&dir).unwrap();
        for (name, config) in
            [("none", None), ("no-key", Some(r#"{"model_type": "bert"}"#)), ("null", Some(r#"{"id2label": null}"#))]
        {
            let dir = folder(name, config);
            assert_eq!(ClassLabels::read(&dir).unwrap(), ClassLabels::default(), "{name}");
            assert_eq!(ClassLabels::default().name(3), "LABEL_3");
            fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_malformed_id2label_is_a_usage_error_naming_the_file() {
        for (name, config, says) in [
            ("list", r#"{"id2label": ["a", "b"]}"#, "must be an object"),
            ("key", r#"{"id2label": {"first": "a"}}"#, r#"key "first" is not a class index"#),
            ("negative", r#"{"id2label": {"-1": "a"}}"#, r#"key "-1" is not a class index"#),
            ("value", r#"{"id2label": {"0": 7}}"#, r#"name of class "0" is not a string"#),
            ("json", r#"{"id2label": "#, "is not valid JSON"),
        ] {
            let dir = folder(name, Some(config));
            let message = ClassLabels::read(&dir).unwrap_err().to_string();
            assert!(message.contains(&dir.join(MODEL_CONFIG_FILE).display().to_string()), "{message}");
            assert!(message.contains(says), "{message}");
            fs::remove_dir_all(&dir).unwrap();
        }
    }
}
