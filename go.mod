module github.com/pinboard-go/pinboard

go 1.26.8

require (
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/valyala/fasthttp v1.78.0
)

require (
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/molecule-man/go-brrr v1.3.1 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	github.com/stretchr/testify v1.11.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	golang.org/x/sync v0.11.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
