package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// NormalizePCI writes a PCI address the way Linux names it in sysfs and
// lspci -D: a 4-digit domain, lower case ("0000:3b:00.0"). NVML says
// "00000000:3B:00.0", nvidia-smi the same, the kernel's Xid lines
// "0000:3b:00" (no function); all of them compare equal after this, the last
// by prefix (see host.SamePCIDevice). Input it cannot parse comes back
// lower-cased and trimmed.
func NormalizePCI(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", d, rest)
}
