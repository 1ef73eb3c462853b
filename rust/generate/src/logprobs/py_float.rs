//! Floats written as Python's `json.dumps` writes them (`repr`): the
//! shortest digits that read back the same, in fixed notation for exponents
//! from -5 to 15 (`0.0001`, `-0.6931471824645996`, `1e-05`, `1e+16`).

use std::fmt::Write;

/// Appends `x` to `out` as Python's `json.dumps` writes it.
pub fn write_py_float(out: &mut String, x: f64) {
    if x.is_nan() {
        return out.push_str("NaN");
    }
    if x.is_infinite() {
        return out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does.
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if negative {
        out.push('-');
    }
    if (-5 < exponent) && (exponent < 16) {
        let point = exponent + 1; // digits before the decimal point
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            let (int, frac) = digits.split_at(point as usize);
            out.push_str(int);
            out.push('.');
            out.push_str(frac);
        }
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        write!(out, "e{sign}{:02}", exponent.abs()).expect("write to String");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(x: f64) -> String {
        let mut out = String::new();
        write_py_float(&mut out, x);
        out
    }

    #[test]
    fn matches_python_repr() {
        // Each right-hand side is Python 3's json.dumps of the value.
        let cases: &[(f64, &str)] = &[
            (-9999.0, "-9999.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::from(-std::f32::consts::LN_2), "-0.6931471824645996"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (-1.1920928955078125e-07, "-1.1920928955078125e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123.25, "123.25"),
            (-2.5e-300, "-2.5e-300"),
            (1.5e300, "1.5e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (x, expected) in cases {
            assert_eq!(py(*x), *expected, "{x:e}");
        }
    }
}
