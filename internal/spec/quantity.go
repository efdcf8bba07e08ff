package spec

import (
	"fmt"
	"math/big"
	"strings"
)

// quantityRE accepts the Kubernetes quantity grammar we care about for byte
// sizes: a decimal number (optionally with a fraction or an exponent) and an
// optional binary (Ki..Ei) or decimal (k, M..E) suffix. Compiled on first
// use: a raw device's spec has no size, and compiling at start-up cost
// every run of salt-volume-exec 0.1-0.2 ms.
var quantityRE = lazyRE(`^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))?$`)

var suffixFactor = map[string]*big.Int{
	"":   big.NewInt(1),
	"k":  pow(10, 3),
	"M":  pow(10, 6),
	"G":  pow(10, 9),
	"T":  pow(10, 12),
	"P":  pow(10, 15),
	"E":  pow(10, 18),
	"Ki": pow(2, 10),
	"Mi": pow(2, 20),
	"Gi": pow(2, 30),
	"Ti": pow(2, 40),
	"Pi": pow(2, 50),
	"Ei": pow(2, 60),
}

func pow(base, exp int64) *big.Int {
	return new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil)
}

// ParseSize turns a Kubernetes quantity ("10Gi", "1.5Gi", "500M",
// "1073741824", "1e9") into a whole number of bytes. Fractions of a byte are
// refused rather than rounded: a size that does not name whole bytes is
// almost certainly a typo ("1.5" meant "1.5Gi").
func ParseSize(s string) (int64, error) {
	if t := strings.TrimSpace(s); t != s {
		return 0, fmt.Errorf("%q has spaces around it: write %q", s, t)
	}
	if s == "" {
		return 0, fmt.Errorf("empty size: use a quantity such as 10Gi, 500M or 1073741824")
	}
	m := quantityRE().FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a size: use a quantity such as 10Gi, 1.5Gi, 500M or 1073741824 (suffixes k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei)", s)
	}
	num, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	if exp := m[2]; exp != "" {
		var e int64
		if _, err := fmt.Sscanf(exp[1:], "%d", &e); err != nil || e > 30 || e < -30 {
			return 0, fmt.Errorf("%q: exponent out of range", s)
		}
		f := new(big.Rat).SetInt(pow(10, abs(e)))
		if e < 0 {
			num.Quo(num, f)
		} else {
			num.Mul(num, f)
		}
	} else {
		num.Mul(num, new(big.Rat).SetInt(suffixFactor[m[3]]))
	}
	if num.Sign() <= 0 {
		return 0, fmt.Errorf("%q: size must be greater than zero", s)
	}
	if !num.IsInt() {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	n := num.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n.Int64(), nil
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// FormatSize renders bytes in the largest binary unit that divides them, the
// way an operator would write it back ("10Gi", "1536Mi", "500000000").
func FormatSize(n int64) string {
	units := []string{"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"}
	for i, u := range units {
		shift := uint(60 - 10*i)
		if n > 0 && n%(int64(1)<<shift) == 0 {
			return fmt.Sprintf("%d%s", n>>shift, u)
		}
	}
	return fmt.Sprintf("%d", n)
}

// Approx rounds a byte count for people: "1.5GiB", "640B". Specs keep exact
// quantities (FormatSize); tables and messages about room use this.
func Approx(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f%ciB", v, "KMGTPE"[i])
}
