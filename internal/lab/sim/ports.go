package sim

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// checkPorts returns an error naming the first port of ports (service by
// port) that something already listens on, and the process that holds it
// when /proc tells.
func checkPorts(ports map[int]string) error {
	var list []int
	for p := range ports {
		list = append(list, p)
	}
	sort.Ints(list)
	for _, p := range list {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return fmt.Errorf("port %d (%s) is taken%s: stop it first (a leftover of an earlier run, or another program)", p, ports[p], portOwner(p))
		}
		ln.Close()
	}
	return nil
}

// portOwner describes the process listening on TCP port port, as
// " by <name> (pid N)", or "" when it cannot tell.
func portOwner(port int) string {
	pid, name := portPID(port)
	if pid == 0 {
		return ""
	}
	return fmt.Sprintf(" by %s (pid %d)", name, pid)
}

// portPID returns the id and command name of the process listening on TCP
// port port on any address, or 0 when none is found in /proc.
func portPID(port int) (int, string) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, ino := range listeningInodes(f, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return 0, ""
	}
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range pids {
		fds, _ := filepath.Glob(dir + "/fd/*")
		for _, fd := range fds {
			link, err := os.Readlink(fd)
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				name, _ := os.ReadFile(dir + "/comm")
				pid, _ := strconv.Atoi(filepath.Base(dir))
				return pid, strings.TrimSpace(string(name))
			}
		}
	}
	return 0, ""
}

// listeningInodes returns the socket inodes listening on port in a
// /proc/net/tcp file.
func listeningInodes(file string, port int) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			out = append(out, fields[9])
		}
	}
	return out
}
