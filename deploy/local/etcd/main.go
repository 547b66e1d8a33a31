// Command etcd runs the etcd server from the pinned go.etcd.io/etcd/server/v3 module.
// Debian's etcd is too old for the streaming watch-list that client-go >= 0.34 uses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
