//! Pooled vectors made answers: embeddings as float lists or base64,
//! scores by cosine or a cross-encoder's classifier, class labels, and
//! reranked documents, and `/v2/embed`'s encodings.

use super::types::{CohereEmbeddingType, CohereEmbeddings};
use base64::Engine;
use serde_json::Value;
use vllm_rs_model_files::class_labels::ClassLabels;

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

/// The name of the most likely class (the first of equals, as NumPy's
/// `argmax`) in `labels`, as vLLM 0.33 looks it up in `id2label`.
pub fn label(probs: &[f32], labels: &ClassLabels) -> String {
    let best = probs.iter().enumerate().fold(0, |best, (i, &p)| if p > probs[best] { i } else { best });
    labels.name(best)
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

/// Why embeddings cannot be bit-packed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// Packing needs whole bytes of values.
    #[error("Embedding dimension must be a multiple of 8 for binary embedding types, but got {0}.")]
    NotWholeBytes(usize),
}

/// `vector` as bits, one per value (set when >= 0, so NaN is 0), eight to a
/// byte, first value in the high bit: NumPy's `packbits(v >= 0)`, as vLLM
/// packs `binary` and `ubinary`.
pub fn pack_bits(vector: &[f32]) -> Result<Vec<u8>, PackError> {
    if !vector.len().is_multiple_of(8) {
        return Err(PackError::NotWholeBytes(vector.len()));
    }
    Ok(vector
        .chunks_exact(8)
        .map(|byte| byte.iter().fold(0u8, |packed, &x| (packed << 1) | u8::from(x >= 0.0)))
        .collect())
}

/// Each vector in every requested encoding (vLLM's `build_typed_embeddings`;
/// an encoding asked twice is answered once).
pub fn typed_embeddings(vectors: &[Vec<f32>], types: &[CohereEmbeddingType]) -> Result<CohereEmbeddings, PackError> {
    let mut embeddings = CohereEmbeddings::default();
    for kind in types {
        match kind {
            CohereEmbeddingType::Float => {
                embeddings.float = Some(vectors.iter().map(|v| Encoding::Float.write(v)).collect());
            }
            CohereEmbeddingType::Base64 => {
                embeddings.base64 = Some(vectors.iter().map(|v| Encoding::Base64.write(v)).collect());
            }
            CohereEmbeddingType::Ubinary => {
                embeddings.ubinary = Some(vectors.iter().map(|v| pack_bits(v)).collect::<Result<_, _>>()?);
            }
            CohereEmbeddingType::Binary => {
                // vLLM's signed bytes: the unsigned byte less 128, not its two's complement.
                let signed = |v: &Vec<f32>| Ok(pack_bits(v)?.into_iter().map(|b| i16::from(b) - 128).collect());
                embeddings.binary = Some(vectors.iter().map(signed).collect::<Result<_, PackError>>()?);
            }
        }
    }
    Ok(embeddings)
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
    }

    #[test]
    fn the_best_class_is_named_from_id2label_else_label_n() {
        let labels: ClassLabels = [(0, "negative".to_owned()), (1, "positive".to_owned())].into_iter().collect();
        assert_eq!(label(&[0.2, 0.8], &labels), "positive");
        assert_eq!(label(&[0.5, 0.5], &labels), "negative", "the first of equals");
        assert_eq!(label(&[0.2, 0.1, 0.7], &labels), "LABEL_2", "a class id2label does not name");
        assert_eq!(label(&[0.2, 0.7, 0.1], &ClassLabels::default()), "LABEL_1");
    }

    #[test]
    fn bits_pack_msb_first_with_zero_set_and_nan_clear() {
        let v = [1.0, -1.0, 0.0, -0.0, f32::NAN, -3.0, 2.0, -0.5, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 5.0];
        assert_eq!(pack_bits(&v), Ok(vec![0b1011_0010, 0b0000_0001]));
        assert_eq!(pack_bits(&[1.0; 12]), Err(PackError::NotWholeBytes(12)));
        assert_eq!(
            PackError::NotWholeBytes(12).to_string(),
            "Embedding dimension must be a multiple of 8 for binary embedding types, but got 12."
        );
    }

    #[test]
    fn typed_embeddings_answer_only_what_was_asked() {
        let vectors = vec![vec![1.0; 8], vec![-1.0; 8]];
        let typed = typed_embeddings(&vectors, &[CohereEmbeddingType::Binary, CohereEmbeddingType::Ubinary]).unwrap();
        assert_eq!(typed.binary, Some(vec![vec![127], vec![-128]]));
        assert_eq!(typed.ubinary, Some(vec![vec![255], vec![0]]));
        assert!(typed.float.is_none() && typed.base64.is_none());
        let typed = typed_embeddings(&vectors, &[CohereEmbeddingType::Float, CohereEmbeddingType::Base64]).unwrap();
        assert_eq!(typed.float.unwrap()[1], Encoding::Float.write(&vectors[1]));
        assert_eq!(typed.base64.unwrap()[0], Encoding::Base64.write(&vectors[0]));
        let odd = typed_embeddings(&[vec![1.0; 3]], &[CohereEmbeddingType::Float, CohereEmbeddingType::Binary]);
        assert_eq!(odd, Err(PackError::NotWholeBytes(3)));
    }
}
