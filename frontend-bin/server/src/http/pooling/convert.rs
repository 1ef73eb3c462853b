//! Pooled vectors made answers: embeddings as float lists or base64,
//! scores by cosine or a cross-encoder's classifier, class labels, and
//! reranked documents.

use base64::Engine;
use serde_json::Value;

/// How embeddings are written (`encoding_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A JSON list of floats.
    Float,
    /// Base64 of the little-endian float32 bytes, as vLLM writes it.
    Base64,
}

impl Encoding {
    /// Reads `encoding_format` (absent: float); None for anything else.
    pub fn parse(value: Option<&str>) -> Option<Encoding> {
        match value {
            None | Some("float") => Some(Encoding::Float),
            Some("base64") => Some(Encoding::Base64),
            Some(_) => None,
        }
    }

    /// `vector` in this encoding.
    pub fn write(self, vector: &[f32]) -> Value {
        match self {
            Encoding::Float => Value::from(vector.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>()),
            Encoding::Base64 => {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

/// The cosine similarity of two embeddings (0 when either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let denominator = norm(a) * norm(b);
    if denominator == 0.0 {
        0.0
    } else {
        (dot / denominator) as f32
    }
}

/// The label of the most likely class (`LABEL_<n>`, transformers' default names).
pub fn label(probs: &[f32]) -> String {
    let best = probs.iter().enumerate().fold(0, |best, (i, &p)| if p > probs[best] { i } else { best });
    format!("LABEL_{best}")
}

/// Document indices by score, best first (ties keep request order), cut to
/// `top_n` when it is positive.
pub fn ranking(scores: &[f32], top_n: Option<usize>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    if let Some(n) = top_n.filter(|&n| n > 0) {
        order.truncate(n);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_little_endian_float32_bytes() {
        let written = Encoding::Base64.write(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD.decode(written.as_str().unwrap()).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
        assert_eq!(Encoding::parse(Some("hex")), None);
    }

    #[test]
    fn cosine_and_ranking() {
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-7);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(ranking(&[0.1, 0.9, 0.5], None), vec![1, 2, 0]);
        assert_eq!(ranking(&[0.1, 0.9, 0.5], Some(2)), vec![1, 2]);
        assert_eq!(label(&[0.2, 0.7, 0.1]), "LABEL_1");
    }
}
