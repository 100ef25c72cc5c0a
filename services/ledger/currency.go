package ledger

import "strings"

// iso4217 lists the active ISO 4217 currency codes (funds and precious
// metals excluded).
const iso4217 = `AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL
BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP
GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF
KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN
NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD
SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VED VES
VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG`

var currencies = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range strings.Fields(iso4217) {
		m[c] = true
	}
	return m
}()

// ValidCurrency reports whether c is an active ISO 4217 currency code.
func ValidCurrency(c string) bool { return currencies[c] }
