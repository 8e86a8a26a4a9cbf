package metrics

// ContentCoding is contentCoding, for the tests.
var ContentCoding = contentCoding
