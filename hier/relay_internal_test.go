package hier

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// Every IPv4 address and port survives the gather buffer's packing, as a
// positive int64 (the collective takes the maximum over the ranks' words,
// the others' zeros).
func TestRelayAddressPacking(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var b [4]byte
		for i := range b {
			b[i] = byte(rapid.IntRange(0, 255).Draw(rt, "byte"))
		}
		ap := netip.AddrPortFrom(netip.AddrFrom4(b), uint16(rapid.IntRange(1, 65535).Draw(rt, "port")))
		v := packAddr(ap)
		require.Positive(rt, v)
		require.Less(rt, v, int64(1)<<48)
		require.Equal(rt, ap, unpackAddr(v))
	})
}

// The relay's address: the option's, else the interface NCCL_SOCKET_IFNAME
// names (prefix or exact), else none where it names none here.
func TestRelayHost(t *testing.T) {
	require.Equal(t, "10.1.2.3", relayHost("10.1.2.3"))
	for _, tc := range []struct{ spec, want string }{
		{"lo", "127.0.0.1"},
		{"=lo", "127.0.0.1"},
		{"l", "127.0.0.1"},
		{"=l", ""},
		{"no-such-interface", ""},
		{"no-such-interface,lo", "127.0.0.1"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			t.Setenv("NCCL_SOCKET_IFNAME", tc.spec)
			require.Equal(t, tc.want, relayHost(""))
		})
	}
	t.Run("^lo", func(t *testing.T) {
		t.Setenv("NCCL_SOCKET_IFNAME", "^lo")
		require.NotEqual(t, "127.0.0.1", relayHost(""), "an excluded loopback")
	})
}

func TestCheckHostMustBeIPv4(t *testing.T) {
	for _, host := range []string{"::1", "localhost", "10.0.0", "10.0.0.1:80"} {
		err := ValidateOptions(WithCheckHost(host))
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, host)
		require.Equal(t, "WithCheckHost", ae.Arg)
	}
	require.NoError(t, ValidateOptions(WithCheckHost("10.0.0.1")))
}
